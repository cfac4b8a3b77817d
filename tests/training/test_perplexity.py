"""Per-token log-probabilities and the scores built on them, against Hugging Face's GPT-2 on the same weights."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.loading import load
from qkv.training.perplexity import score_text, token_log_probs, windows
from tests.pretrained.conftest import gpt2_dir, gpt2_hf  # noqa: F401  (session fixtures, built once)

TEXT = "The quick brown fox jumps over the lazy dog. A man is eating food. The girl is carrying a baby."


def hf_log_probs(hf, ids: list[int]) -> torch.Tensor:
    """log P(token t | tokens before it) for t = 1..N-1, from Hugging Face's model in one pass."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids[:-1]])).logits[0].double()  # (N-1, V): row t predicts token t+1
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_windows_predict_every_token_after_the_first_once() -> None:
    for n, c in ((1, 4), (2, 4), (5, 4), (6, 4), (10, 4), (13, 4)):
        spans = windows(n, c)
        predicted = [t for s, e in spans for t in range(s + 1, e)]
        assert predicted == list(range(1, n)) and all(e - s <= c + 1 for s, e in spans)


def test_token_log_probs_and_the_score_match_hugging_face(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    bundle = load(str(gpt2_dir))
    ids = bundle.tokenizer.encode(TEXT)
    assert 2 < len(ids) <= 64  # one window of the 64-position model
    scored = token_log_probs(bundle.model, ids, top=4)
    expected = hf_log_probs(gpt2_hf, ids)
    torch.testing.assert_close(scored.logprobs.double(), expected, atol=1e-4, rtol=0)
    assert scored.top_ids.shape == (len(ids) - 1, 4) and (scored.top_logprobs[:, :1] >= scored.logprobs[:, None]).all()
    with torch.no_grad():
        hf_loss = float(gpt2_hf(torch.tensor([ids]), labels=torch.tensor([ids])).loss)
    score = score_text(bundle.model, bundle.tokenizer, TEXT)
    assert score.tokens == len(ids) - 1 and score.loss == pytest.approx(hf_loss, abs=1e-4)
    assert score.loss == pytest.approx(-float(scored.logprobs.double().mean()), rel=1e-12)
    assert score.perplexity == pytest.approx(math.exp(score.loss))


def test_a_text_longer_than_the_context_is_scored_window_by_window(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    bundle = load(str(gpt2_dir))
    ids = bundle.tokenizer.encode(TEXT * 4)
    assert len(ids) > 2 * 64
    scored = token_log_probs(bundle.model, ids, batch_size=2).logprobs  # several batches of windows
    assert scored.shape == (len(ids) - 1,)
    parts = [hf_log_probs(gpt2_hf, ids[s:e]) for s, e in windows(len(ids), 64)]
    torch.testing.assert_close(scored.double(), torch.cat(parts), atol=1e-4, rtol=0)
