"""The decoding engines on the Llama family (RMSNorm, SwiGLU, RoPE, grouped-query attention, Qwen2's q/k/v
biases): every CPU engine gives the greedy tokens of the model's own uncached forward, and the static cache
of a grouped-query model is n_kv_heads / n_heads the size of the full-heads one."""

from __future__ import annotations

import pytest
import torch

from qkv.decoding import Engine, generate
from qkv.models import LlamaConfig
from qkv.models.llama import Llama
from qkv.models.memory import kv_cache_bytes_per_token

VARIANTS = {
    "full heads": dict(n_kv_heads=4),
    "grouped": dict(n_kv_heads=2),
    "multi-query": dict(n_kv_heads=1),
    "qwen2": dict(n_kv_heads=2, qkv_bias=True, tie_embeddings=True, rope_base=1e6),
}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest (tests/conftest.py)


def tiny_llama(**variant) -> Llama:
    torch.manual_seed(1)
    config = LlamaConfig(
        vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=48, context_length=40, init_std=0.5, **variant
    )
    model = Llama(config).double().eval()
    with torch.no_grad():  # norm gains other than 1, so that a norm left out changes the tokens
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_cpu_engine_gives_the_greedy_tokens_of_the_uncached_forward(variant: str, quick_compile) -> None:
    model = tiny_llama(**VARIANTS[variant])
    prompt = torch.randint(50, (2, 5), generator=torch.Generator().manual_seed(0))
    reference = generate(model, prompt, max_new_tokens=20, temperature=0, use_cache=False)
    for engine in ("model", "static", "compiled"):
        out = generate(model, prompt, max_new_tokens=20, temperature=0, step=engine)
        assert torch.equal(out, reference), engine
    assert not quick_compile["graph_break"]


def _static_cache(model: Llama, batch: int, max_len: int) -> torch.Tensor:
    return Engine(model, batch, max_len, step="static").buffer


@pytest.mark.parametrize("n_kv_heads", [2, 1])
def test_a_grouped_query_static_cache_is_n_kv_heads_over_n_heads_of_the_full_one(n_kv_heads: int) -> None:
    full = _static_cache(tiny_llama(n_kv_heads=4), 3, 24)
    grouped = _static_cache(tiny_llama(n_kv_heads=n_kv_heads), 3, 24)
    assert full.shape == (2, 3, 2, 4, 24, 8) and grouped.shape == (2, 3, 2, n_kv_heads, 24, 8)
    full_bytes, grouped_bytes = full.numel() * full.element_size(), grouped.numel() * grouped.element_size()
    assert grouped_bytes * 4 == full_bytes * n_kv_heads
    per_token = kv_cache_bytes_per_token(tiny_llama(n_kv_heads=n_kv_heads).config, torch.float64)
    assert per_token * 3 * 24 == grouped_bytes  # the estimate is what the engine allocates
