"""`qkv export --onnx` of a Llama-family model (grouped-query attention, RMSNorm, SwiGLU, rotary positions,
Qwen2's q/k/v biases): the graph's cache holds n_kv_heads heads, and onnxruntime's greedy loop writes the
tokens qkv writes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.decoding import generate
from qkv.export.onnx_runtime import OnnxGPT
from qkv.models import LlamaConfig
from qkv.models.llama import Llama
from tests.export.conftest import export

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


@pytest.fixture(scope="module", params=[2, 1], ids=["gqa", "mqa"])
def llama_onnx(request, onnx_root, tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_kv_heads=request.param,
                         qkv_bias=True, n_layers=2, context_length=40)  # fmt: skip
    return export(onnx_root, f"llama-kv{request.param}", Llama(config), tokenizer)


def test_the_graph_caches_n_kv_heads_heads(llama_onnx) -> None:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(llama_onnx.files[0]), providers=["CPUExecutionProvider"])
    config = llama_onnx.bundle.config
    past = [i for i in session.get_inputs() if i.name.startswith("past")]
    assert len(past) == 2 * config.n_layers
    assert all(i.shape[1] == config.n_kv_heads and i.shape[3] == config.head_dim for i in past)


def test_llama_greedy_generation_equals_qkv(llama_onnx, tokenizer) -> None:
    model = llama_onnx.bundle.model
    prompts = torch.tensor([tokenizer.encode("the quick"), tokenizer.encode("a man is ")[:9]])
    ours = OnnxGPT(llama_onnx.files[0]).generate_greedy(prompts.numpy(), 25)
    assert np.array_equal(ours, generate(model, prompts, max_new_tokens=25, temperature=0.0).numpy())


def test_a_sliding_window_traced_at_short_lengths_still_slides_at_long_ones(onnx_root, tokenizer) -> None:
    """The graph is traced on 5 positions, inside the window of 12: it must keep the window's mask anyway."""
    torch.manual_seed(1)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                         context_length=80, sliding_window=12)  # fmt: skip
    exported = export(onnx_root, "llama-window", Llama(config), tokenizer)
    prompts = torch.tensor([tokenizer.encode("the quick"), tokenizer.encode("a man is ")[:9]])
    ours = OnnxGPT(exported.files[0]).generate_greedy(prompts.numpy(), 60)  # 69 positions: far past the window
    reference = generate(exported.bundle.model, prompts, max_new_tokens=60, temperature=0.0, step="model")
    assert np.array_equal(ours, reference.numpy())
