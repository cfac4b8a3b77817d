"""The views work on pretrained bundles too: small random GPT-2 and Marian folders in Hugging Face format."""

from __future__ import annotations

import numpy as np
import torch

from qkv.inspect import attention_maps, explain_model, next_token, positional_table
from qkv.layers.capture import capture
from qkv.loading import load
from tests.pretrained.conftest import gpt2_dir, marian_dir  # noqa: F401  (session fixtures, built once)


def test_gpt2_maps_explain_and_next_token(gpt2_dir) -> None:  # noqa: F811
    bundle = load(str(gpt2_dir))
    text = "The quick brown fox"
    maps = attention_maps(bundle, text)
    ids = bundle.tokenizer.encode(text)
    with capture(bundle.model) as acts:
        logits = bundle.model(torch.tensor([ids]))[0, -1].detach().double()
    group = maps.groups["decoder"]
    assert group.weights.shape == (2, 4, len(ids), len(ids))
    np.testing.assert_array_equal(group.weights[1], acts["decoder.blocks.1.self_attn.weights"][0].double().numpy())
    e = explain_model(bundle, text, layer=1, head=3, query=-1)
    assert e.model_difference < 1e-6 and e.query == len(ids) - 1 and e.heads.output.shape == (len(ids), 64)
    result = next_token(bundle, text, top=3)
    np.testing.assert_allclose(result.probabilities[1], torch.softmax(logits, -1).numpy(), rtol=1e-4)
    assert "learned" in positional_table(bundle)[1]


def test_marian_has_three_kinds_of_attention(marian_dir) -> None:  # noqa: F811
    bundle = load(str(marian_dir[0]))
    maps = attention_maps(bundle, "the cat sat", target="die katze")
    cross = maps.groups["cross"]
    assert list(maps.groups) == ["encoder", "decoder", "cross"]
    assert cross.weights.shape[2:] == (len(maps.target_tokens), len(maps.source_tokens))
    np.testing.assert_allclose(cross.weights.sum(axis=-1), 1.0, atol=1e-5)
    e = explain_model(bundle, "the cat sat", part="cross", target="die katze", layer=1, head=2)
    assert e.model_difference < 1e-6 and e.key_tokens == maps.source_tokens
    assert next_token(bundle, "the cat sat", target_prefix="die").context_tokens[0] == maps.target_tokens[0]
