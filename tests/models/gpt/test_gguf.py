"""gpt2 files written with gguf-py's GGUFWriter (random weights, fused attn_qkv), read by qkv and transformers."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.models import GPTConfig
from qkv.models.gpt.gguf import check_gpt
from qkv.pretrained.gguf import load_gguf
from tests.gguf_files import byte_level_tokenizer_metadata, hf_from_gguf, logits, need, random_tensors, write_file


def write_gpt2(tmp_path, *, d=32, layers=2, tied=True):
    need("gguf")
    tokenizer = byte_level_tokenizer_metadata()
    vocab, context = len(tokenizer["tokenizer.ggml.tokens"]), 1024  # transformers' GPT-2 has 1024 positions
    shapes = {"token_embd.weight": (vocab, d), "position_embd.weight": (context, d),
              "output_norm.weight": (d,), "output_norm.bias": (d,)}  # fmt: skip
    if not tied:
        shapes["output.weight"] = (vocab, d)
    for i in range(layers):
        for name, shape in {"attn_norm": (d,), "attn_qkv": (3 * d, d), "attn_output": (d, d), "ffn_norm": (d,),
                            "ffn_up": (4 * d, d), "ffn_down": (d, 4 * d)}.items():  # fmt: skip
            shapes[f"blk.{i}.{name}.weight"], shapes[f"blk.{i}.{name}.bias"] = shape, shape[:1]
    metadata = {"gpt2.block_count": layers, "gpt2.context_length": context, "gpt2.embedding_length": d,
                "gpt2.feed_forward_length": 4 * d, "gpt2.attention.head_count": 4,
                "gpt2.attention.layer_norm_epsilon": 1e-5, **tokenizer}  # fmt: skip
    return write_file(tmp_path / "gpt2.gguf", "gpt2", metadata, random_tensors(shapes))


@pytest.mark.parametrize("tied", [True, False])
def test_logits_equal_transformers(tmp_path, tied):
    path = write_gpt2(tmp_path, tied=tied)
    bundle = load_gguf(path)
    config = bundle.config
    assert (config.positional, config.activation, config.tie_embeddings) == ("learned", "gelu_tanh", tied)
    ids = torch.tensor([bundle.tokenizer.encode("in the other one, as the interns said " * 4)])
    delta = (logits(bundle.model, ids) - logits(hf_from_gguf(path), ids)).abs().max().item()
    assert delta < 1e-4, delta


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"norm": "rmsnorm"}, "norm='rmsnorm'"),
        ({"feed_forward": "glu"}, "feed_forward='glu'"),
        ({"norm_first": False}, "norm_first=False"),
        ({"activation": "relu"}, "activation='relu'"),
        ({"activation": "gelu"}, "--gguf-approximate-gelu"),
    ],
)
def test_configs_llama_cpp_cannot_run_are_refused(change, fragment):
    config = GPTConfig(vocab_size=10, d_model=8, n_heads=2, activation="gelu_tanh").replace(**change)
    with pytest.raises(QkvError, match=fragment) as error:
        check_gpt(config, "gpt2", approximate_gelu=False)
    assert "\n" not in str(error.value)
    check_gpt(GPTConfig(vocab_size=10, d_model=8, n_heads=2, activation="gelu"), "gpt2", approximate_gelu=True)
