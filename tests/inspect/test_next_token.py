"""`next`: the probabilities printed at T = 1 are softmax(logits); temperature reshapes but keeps the order."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect import draw_next_token, next_token, png_size
from qkv.model_dir import ModelBundle
from qkv.models import Encoder, EncoderConfig


def test_t1_probabilities_equal_softmax_of_the_models_logits(gpt) -> None:
    result = next_token(gpt, "the qu", temperatures=[0.5, 1.0, 2.0], top=5)
    ids = torch.tensor([gpt.tokenizer.encode("the qu")])
    with torch.no_grad():
        logits = gpt.model(ids)[0, -1].double()  # the last position's logits, computed here
    expected = torch.softmax(logits, dim=-1).numpy()
    np.testing.assert_allclose(result.logits, logits.numpy(), atol=1e-5)  # float32: last_only vs full pass
    np.testing.assert_allclose(result.probabilities[1], expected, rtol=1e-4)
    shown = torch.from_numpy(result.logits)
    for k, t in enumerate([0.5, 1.0, 2.0]):  # exactly softmax(logits / T) of the logits it reports
        np.testing.assert_allclose(result.probabilities[k], torch.softmax(shown / t, -1).numpy(), rtol=1e-12)
    assert result.top_ids == torch.argsort(logits, descending=True)[:5].tolist()
    top = result.top_probabilities
    assert np.all(np.diff(top, axis=1) <= 0)  # the same order, likeliest first, at every temperature
    assert top[0, 0] > top[1, 0] > top[2, 0]  # a lower T gives the top token more
    entropy = result.entropy()
    assert entropy[0] < entropy[1] < entropy[2]
    data = json.loads(json.dumps(result.to_dict()))
    assert data["top"][0]["probabilities"]["1"] == pytest.approx(float(expected.max()))
    assert data["top"][0]["token"] == gpt.tokenizer.id_to_token(result.top_ids[0])


def test_a_translators_next_target_token_follows_its_prefix(translator) -> None:
    result = next_token(translator, "the fox", target_prefix="ov", top=3)
    tok = translator.tokenizer
    model = translator.model
    with torch.no_grad():
        memory = model.encode(torch.tensor([tok.encode("the fox")]))
        logits = model.decode(torch.tensor([[tok.bos_id, *tok.encode("ov")]]), memory)[0, -1].double()
    np.testing.assert_allclose(result.probabilities[1], torch.softmax(logits, -1).numpy(), rtol=1e-4)
    assert result.context_tokens == ["<bos>", "o", "v"]


def test_an_encoder_and_bad_temperatures_are_errors(char_tokenizer, gpt) -> None:
    model = Encoder(EncoderConfig(vocab_size=char_tokenizer.vocab_size, d_model=8, n_heads=2, n_layers=1))
    encoder = ModelBundle(model, model.config, char_tokenizer, None, None)
    with pytest.raises(QkvError, match="next-token prediction needs an unembedding, and an encoder"):
        next_token(encoder, "the fox")
    for bad in ([-1.0], [], [float("nan")], [float("inf")]):
        with pytest.raises(QkvError, match="temperatures must be numbers >= 0"):
            next_token(gpt, "the", temperatures=bad)
    with pytest.raises(QkvError, match="top_k"):
        next_token(gpt, "the", top_k=-2)
    with pytest.raises(QkvError, match="top_p"):
        next_token(gpt, "the", top_p=1.5)


def test_filters_give_the_distribution_hugging_face_samples_from(gpt) -> None:
    """Temperature, top-k and top-p as Hugging Face's logits warpers apply them (a reference we did not write)."""
    warpers = pytest.importorskip("transformers.generation.logits_process")
    result = next_token(gpt, "the qu", temperatures=[0.7, 1.3], top_k=6, top_p=0.8, top=5)
    logits = torch.from_numpy(result.logits)[None]  # (1, V) float64
    for k, t in enumerate(result.temperatures):
        scores = warpers.TemperatureLogitsWarper(t)(None, logits.clone())
        scores = warpers.TopKLogitsWarper(top_k=6)(None, scores)
        scores = warpers.TopPLogitsWarper(top_p=0.8)(None, scores)
        expected = torch.softmax(scores, dim=-1)[0].numpy()
        np.testing.assert_allclose(result.probabilities[k], expected, atol=1e-12)
        assert result.kept()[k] == int((expected > 0).sum()) <= 6
    np.testing.assert_allclose(result.model_probabilities, torch.softmax(logits[0], -1).numpy(), rtol=1e-12)


def test_temperature_zero_is_greedy(gpt) -> None:
    result = next_token(gpt, "the qu", temperatures=[0, 1], top=3)
    assert result.probabilities[0, result.top_ids[0]] == 1 and result.probabilities[0].sum() == 1
    assert result.kept()[0] == 1 and result.entropy()[0] == 0


def test_a_prompt_longer_than_the_context_is_read_as_generation_reads_it(gpt) -> None:
    text = "the quick brown fox jumps over the lazy dog"  # 43 characters, context 32
    result = next_token(gpt, text, temperatures=[1.0])
    window = next_token(gpt, text[-32:], temperatures=[1.0])
    assert result.cropped == len(text) - 32 and window.cropped == 0
    assert result.context_tokens == window.context_tokens and len(result.context_tokens) == 32
    np.testing.assert_array_equal(result.probabilities, window.probabilities)


def test_an_empty_prompt_starts_from_bos(gpt) -> None:
    result = next_token(gpt, "", temperatures=[1.0])
    assert result.context_tokens == ["<bos>"]
    ids = torch.tensor([[gpt.tokenizer.bos_id]])
    with torch.no_grad():
        expected = torch.softmax(gpt.model(ids)[0, -1].double(), -1).numpy()
    np.testing.assert_allclose(result.probabilities[0], expected, rtol=1e-4)


def test_the_chart_has_one_panel_per_temperature(gpt, tmp_path) -> None:
    result = next_token(gpt, "the", temperatures=[0.5, 1, 2, 5], top=8)
    picture = draw_next_token(result.top_tokens, result.top_probabilities, result.temperatures, tmp_path / "n.png")
    assert picture.panels == 4 and png_size(picture.path) == (picture.width, picture.height)
    assert picture.width > picture.height > 200
