"""The Llama family: its parameter names (what the Hugging Face import maps to), per-query-head captures
under grouped-query attention, cached decoding, and its initialisation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from qkv.layers.capture import capture
from qkv.layers.feedforward import GatedFeedForward
from qkv.models import LlamaConfig
from qkv.models.family import build_model
from qkv.models.llama import Llama

VOCAB = 41


def tiny_llama(n_kv_heads: int = 2, **kw) -> Llama:
    config = LlamaConfig(
        vocab_size=VOCAB, d_model=32, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, d_ff=48, context_length=16, **kw
    )
    torch.manual_seed(0)
    return build_model(config).eval()  # type: ignore[return-value]


def test_parameter_names_and_shapes_are_the_ones_the_import_maps_to() -> None:
    model = tiny_llama(n_kv_heads=2)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    block = "decoder.blocks.0."
    expected = {
        "embedding.token_embedding.weight": (VOCAB, 32),
        block + "self_attn_sublayer.norm.weight": (32,),
        block + "self_attn.query.weight": (32, 32),
        block + "self_attn.key.weight": (16, 32),  # kv_dim = 2 heads x 8
        block + "self_attn.value.weight": (16, 32),
        block + "self_attn.out_proj.weight": (32, 32),
        block + "ffn_sublayer.norm.weight": (32,),
        block + "feed_forward.gate.weight": (48, 32),
        block + "feed_forward.linear1.weight": (48, 32),
        block + "feed_forward.linear2.weight": (32, 48),
        "decoder.final_norm.weight": (32,),
        "unembedding.weight": (VOCAB, 32),
    }
    assert {k: shapes.get(k) for k in expected} == expected
    assert not any(name.endswith("bias") for name in shapes)  # Llama: no biases anywhere
    assert len(shapes) == 3 + 2 * 9
    assert isinstance(model.decoder.final_norm, nn.RMSNorm)


def test_qwen2_keeps_biases_on_the_query_key_and_value_only() -> None:
    model = tiny_llama(qkv_bias=True)
    biases = sorted(name for name, _ in model.named_parameters() if name.endswith("bias"))
    assert biases == [f"decoder.blocks.{i}.self_attn.{m}.bias" for i in range(2) for m in ("key", "query", "value")]
    assert model.decoder.blocks[0].self_attn.key.bias.shape == (16,)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_capture_gives_per_query_head_weights_equal_to_the_fast_forward(n_kv_heads: int) -> None:
    model = tiny_llama(n_kv_heads)
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        fast = model(ids)
        with capture(model) as acts:
            explicit = model(ids)
    torch.testing.assert_close(explicit, fast, atol=1e-5, rtol=0)
    weights = acts["decoder.blocks.1.self_attn.weights"]
    assert weights.shape == (2, 4, 9, 9)  # (B, h, T, T): one pattern per query head
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 9))
    assert torch.all(weights.triu(1) == 0)  # causal
    assert acts["decoder.blocks.0.self_attn.k"].shape == (2, 4, 9, 8)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_cached_decoding_equals_the_full_forward(n_kv_heads: int) -> None:
    model = tiny_llama(n_kv_heads, qkv_bias=True)
    ids = torch.randint(0, VOCAB, (2, 10))
    cache = model.new_cache()
    with torch.no_grad():
        full = model(ids)
        pieces = [model(ids[:, :4], cache=cache)] + [model(ids[:, t : t + 1], cache=cache) for t in range(4, 10)]
    assert cache.self_attention[0].keys.shape == (2, n_kv_heads, 10, 8)
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)


def test_initialisation_norm_gains_one_and_residual_projections_scaled() -> None:
    config = LlamaConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_kv_heads=2, n_layers=8, d_ff=256)
    model = build_model(config)
    assert all(torch.all(m.weight == 1) for m in model.modules() if isinstance(m, nn.RMSNorm))
    ffn = model.decoder.blocks[0].feed_forward
    assert isinstance(ffn, GatedFeedForward)
    residual_std = 0.02 / math.sqrt(2 * 8)
    assert ffn.linear2.weight.std().item() == pytest.approx(residual_std, rel=0.1)
    assert ffn.gate.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert ffn.linear1.weight.std().item() == pytest.approx(0.02, rel=0.1)


@pytest.mark.parametrize(
    ("preset", "published"),
    [("smollm-135m", 134_515_008), ("qwen2-0.5b", 494_032_768)],  # their model cards' and HF's counts
)
def test_the_pretrained_shapes_have_the_published_parameter_counts(preset: str, published: int) -> None:
    from qkv.models import make_config
    from qkv.models.memory import parameter_count

    config = make_config(preset)
    assert isinstance(config, LlamaConfig) and parameter_count(config) == published  # counted on the meta device


def test_the_small_presets_build_and_group_their_heads() -> None:
    from qkv.models import make_config

    for preset in ("llama-micro", "llama-mini", "llama-small"):
        config = make_config(preset, vocab_size=VOCAB)
        assert config.n_kv_heads < config.n_heads and config.kind == "llama"
    assert build_model(make_config("llama-micro", vocab_size=VOCAB)).num_parameters() < 10**6
