"""qkv GPTs that llama.cpp runs as starcoder2 (rotary positions, grouped attention) or as gpt2 once rewritten
(sinusoidal positions, scaled embeddings, no biases, grouped attention): exported, read back by qkv and by
transformers."""

from __future__ import annotations

import pytest

from qkv.export.gguf import export_gguf
from qkv.gguf import read_gguf
from qkv.models import GPT, GPTConfig
from qkv.pretrained.gguf import load_gguf
from tests.gguf_files import TEXT, hf_from_gguf, ids_of, logits, need, perturbed


@pytest.mark.parametrize(
    ("arch", "variant"),
    [
        ("starcoder2", dict(positional="rope", n_kv_heads=2, context_length=128)),
        ("starcoder2", dict(positional="rope", bias=False, tie_embeddings=False, context_length=128)),
        ("gpt2", dict(positional="sinusoidal", scale_embeddings=True, bias=False, n_kv_heads=2, context_length=1024)),
        ("gpt2", dict(positional="none", qkv_bias=False, context_length=1024)),
    ],
)
def test_round_trip(tmp_path, bpe, arch, variant):
    need("gguf")
    config = GPTConfig(vocab_size=bpe.vocab_size, n_layers=2, d_model=32, n_heads=4, activation="gelu_tanh", **variant)
    model = perturbed(GPT(config))
    path = export_gguf(model, bpe, tmp_path / "m.gguf", gguf_type="f32")
    assert read_gguf(path).architecture == arch
    ids = ids_of(bpe)
    back = load_gguf(path)
    assert (logits(back.model, ids) - logits(model, ids)).abs().max() < 1e-5
    delta = (logits(hf_from_gguf(path), ids) - logits(model, ids)).abs().max().item()
    assert delta <= 1e-4, delta
    assert back.tokenizer.encode(TEXT) == bpe.encode(TEXT)


def test_exact_gelu_with_the_approximation_accepted(tmp_path, bpe):
    need("gguf")
    config = GPTConfig(vocab_size=bpe.vocab_size, n_layers=2, d_model=32, n_heads=4, positional="rope")
    model = perturbed(GPT(config))  # activation="gelu", the default
    back = load_gguf(export_gguf(model, bpe, tmp_path / "m.gguf", gguf_type="f32", approximate_gelu=True))
    assert back.config.activation == "gelu_tanh"
    delta = (logits(back.model, ids_of(bpe)) - logits(model, ids_of(bpe))).abs().max().item()
    assert 0 < delta < 0.05, delta
