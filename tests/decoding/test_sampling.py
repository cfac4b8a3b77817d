"""Sampling filters and next-token sampling: top-k, top-p (nucleus), min-p, temperature (the GPT notes), greedy, the
penalties, and SamplingParams checked once."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.decoding import SamplingParams, penalize, sample_next, sampling_distribution, top_k_filter, top_p_filter
from qkv.errors import QkvError
from qkv.layers.softmax import softmax

SEED_LOGITS = [2.0, 4.0, 5.0, 1.0, 0.0]  # seed 000's example [2, 4, 5], plus two less likely tokens


def _logits(seed: int, rows: int, vocab: int) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 3


# ------------------------------------------------------------------------------------------ top-k


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 4), vocab=st.integers(2, 40), data=st.data())
def test_top_k_keeps_exactly_the_k_largest(seed: int, rows: int, vocab: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, vocab - 1))
    logits = _logits(seed, rows, vocab)  # continuous values: no ties
    filtered = top_k_filter(logits, k)
    kept = filtered.isfinite()
    assert kept.sum(dim=-1).tolist() == [k] * rows
    for row in range(rows):
        assert set(kept[row].nonzero().flatten().tolist()) == set(logits[row].topk(k).indices.tolist())
    assert torch.equal(filtered[kept], logits[kept])  # kept logits are untouched
    assert (filtered[~kept] == float("-inf")).all()


@pytest.mark.parametrize("k", [None, 0, 5, 9])
def test_top_k_without_effect_returns_logits_unchanged(k: int | None) -> None:
    logits = _logits(0, 3, 5)
    assert torch.equal(top_k_filter(logits, k), logits)


def test_top_k_keeps_ties_with_the_kth_largest() -> None:
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert top_k_filter(logits, 1).isfinite().tolist() == [[False, True, True, False]]


# ------------------------------------------------------------------------------------------ top-p


# probabilities 0.05, 0.5, 0.1, 0.2, 0.15 (shuffled, so the filter must map its sort back correctly)
NUCLEUS_PROBS = torch.tensor([0.05, 0.5, 0.1, 0.2, 0.15], dtype=torch.float64)


@pytest.mark.parametrize(
    ("p", "kept"),
    [
        (0.3, {1}),  # 0.5 alone reaches 0.3
        (0.5, {1}),  # exactly 0.5: still the top token alone
        (0.6, {1, 3}),  # 0.5 + 0.2 = 0.7 >= 0.6
        (0.71, {1, 3, 4}),  # 0.7 < 0.71, so + 0.15 = 0.85
        (0.9, {1, 3, 4, 2}),  # 0.85 < 0.9, so + 0.1 = 0.95
        (0.96, {0, 1, 2, 3, 4}),
        (1e-9, {1}),  # always at least the most likely token ...
        (0.0, {1}),  # ... even for p = 0 (the filter alone; sample_next asks for p > 0)
    ],
)
def test_top_p_keeps_the_hand_computed_nucleus(p: float, kept: set[int]) -> None:
    logits = NUCLEUS_PROBS.log()[None] + 1.7  # any shift: softmax(log p + c) = p
    filtered = top_p_filter(logits, p)
    assert set(filtered[0].isfinite().nonzero().flatten().tolist()) == kept
    assert torch.equal(filtered[0, sorted(kept)], logits[0, sorted(kept)])


@pytest.mark.parametrize("p", [None, 1, 1.0])
def test_top_p_without_effect_returns_logits_unchanged(p: float | None) -> None:
    logits = _logits(1, 2, 7)
    assert torch.equal(top_p_filter(logits, p), logits)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 3), vocab=st.integers(2, 30), p=st.floats(0.01, 0.99))
def test_top_p_nucleus_is_minimal_and_reaches_p(seed: int, rows: int, vocab: int, p: float) -> None:
    logits = _logits(seed, rows, vocab)
    kept = top_p_filter(logits, p).isfinite()
    probs = softmax(logits)
    for row in range(rows):
        kept_probs = probs[row][kept[row]]
        dropped_probs = probs[row][~kept[row]]
        if dropped_probs.numel():
            assert kept_probs.min() >= dropped_probs.max()  # the most likely tokens are the ones kept
            assert kept_probs.sum() >= p - 1e-12  # the nucleus reaches p ...
        assert kept_probs.sum() - kept_probs.min() < p + 1e-12  # ... and is the smallest set that does


# ------------------------------------------------------------------------------------- sampling


def test_temperature_zero_is_argmax_and_draws_no_random_numbers() -> None:
    logits = _logits(2, 8, 11)
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    ids = sample_next(logits, temperature=0, top_k=3, top_p=0.5, generator=generator)
    assert ids.dtype == torch.long and ids.shape == (8,)
    assert torch.equal(ids, logits.argmax(dim=-1))
    assert torch.equal(generator.get_state(), state)


def test_top_k_one_equals_greedy() -> None:
    logits = _logits(4, 16, 9)
    sampled = sample_next(logits, temperature=1.3, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, sample_next(logits, temperature=0))


def _chi_square(ids: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(ids, minlength=probs.numel()).double()
    expected = probs.double() * ids.numel()
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
def test_sample_frequencies_follow_softmax_with_temperature(temperature: float) -> None:
    draws = 20_000
    logits = torch.tensor(SEED_LOGITS).expand(draws, -1)  # (draws, 5): one draw per row
    ids = sample_next(logits, temperature=temperature, generator=torch.Generator().manual_seed(1234))
    target = softmax(torch.tensor(SEED_LOGITS), temperature)
    # chi-square with 4 degrees of freedom: P(chi2 > 18.5) = 0.001 when the frequencies are right
    assert _chi_square(ids, target) < 18.5
    # ... and the test can tell temperatures apart: the same draws do not fit another temperature
    other = softmax(torch.tensor(SEED_LOGITS), temperature * 1.25)
    assert _chi_square(ids, other) > 100


def test_a_tiny_temperature_does_not_overflow() -> None:
    logits = torch.tensor([[3e4, 0.0, -3e4], [-5.0, 2e4, 1e4]])
    ids = sample_next(logits, temperature=1e-30, top_p=0.9, generator=torch.Generator().manual_seed(0))
    assert ids.tolist() == [0, 1]


def test_sampling_is_reproducible_with_a_seeded_generator() -> None:
    logits = _logits(5, 4, 20)
    first = [sample_next(logits, top_p=0.9, generator=torch.Generator().manual_seed(7)) for _ in range(2)]
    assert torch.equal(first[0], first[1])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), k=st.integers(1, 4), p=st.floats(0.05, 1.0))
def test_samples_come_from_the_filtered_set_only(seed: int, k: int, p: float) -> None:
    logits = _logits(seed, 1, 12).expand(500, -1)
    allowed = top_p_filter(top_k_filter(logits[:1] / 0.8, k), p).isfinite()[0]
    ids = sample_next(logits, temperature=0.8, top_k=k, top_p=p, generator=torch.Generator().manual_seed(seed))
    assert allowed[ids].all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), t=st.floats(0.1, 3.0), k=st.integers(0, 12), p=st.floats(0.05, 1.0))
def test_sampling_distribution_is_what_hugging_face_samples_from(seed: int, t: float, k: int, p: float) -> None:
    """logits / T, then top-k, then top-p, then softmax: Hugging Face's logits warpers in generate's order."""
    warpers = pytest.importorskip("transformers.generation.logits_process")
    logits = _logits(seed, 3, 12)
    scores = warpers.TemperatureLogitsWarper(t)(None, logits.clone())
    if k:
        scores = warpers.TopKLogitsWarper(top_k=k)(None, scores)
    scores = warpers.TopPLogitsWarper(top_p=p)(None, scores) if p < 1 else scores
    expected = torch.softmax(scores, dim=-1)
    got = sampling_distribution(logits, temperature=t, top_k=k, top_p=p)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_sampling_distribution_at_t0_is_the_argmax_and_sample_next_draws_from_it() -> None:
    logits = torch.tensor([SEED_LOGITS])
    assert sampling_distribution(logits, temperature=0, top_k=2).tolist() == [[0.0, 0.0, 1.0, 0.0, 0.0]]
    draws = 20_000
    probs = sampling_distribution(torch.tensor(SEED_LOGITS), temperature=0.8, top_k=3)
    ids = sample_next(logits.expand(draws, -1), temperature=0.8, top_k=3, generator=torch.Generator().manual_seed(5))
    kept = probs > 0
    assert kept.sum() == 3 and set(ids.tolist()) <= set(kept.nonzero().flatten().tolist())
    assert _chi_square(ids, probs.clamp_min(1e-12)) < 13.8  # 2 degrees of freedom: P(chi2 > 13.8) = 0.001


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    t=st.floats(0.1, 3.0),
    k=st.integers(0, 12),
    p=st.floats(0.05, 1.0),
    min_p=st.floats(0.0, 0.5),
    r=st.floats(0.5, 2.0),
)
def test_penalties_and_min_p_are_what_hugging_face_applies(seed, t, k, p, min_p, r) -> None:
    """The repetition penalty on the tokens of the text, then logits / T, top-k, top-p and min-p: Hugging Face's
    RepetitionPenaltyLogitsProcessor and warpers in generate's order."""
    processors = pytest.importorskip("transformers.generation.logits_process")
    logits = _logits(seed, 3, 12)
    text = torch.randint(12, (3, 7), generator=torch.Generator().manual_seed(seed))  # prompt + tokens so far
    scores = processors.RepetitionPenaltyLogitsProcessor(penalty=r)(text, logits.clone())
    scores = processors.TemperatureLogitsWarper(t)(None, scores)
    if k:
        scores = processors.TopKLogitsWarper(top_k=k)(None, scores)
    scores = processors.TopPLogitsWarper(top_p=p)(None, scores) if p < 1 else scores
    scores = processors.MinPLogitsWarper(min_p=min_p)(None, scores) if min_p else scores
    expected = torch.softmax(scores, dim=-1)
    params = SamplingParams(temperature=t, top_k=k, top_p=p, min_p=min_p, repetition_penalty=r)
    seen = torch.zeros(3, 12, dtype=torch.bool).scatter(1, text, True)
    got = sampling_distribution(penalize(logits, params, torch.zeros(3, 12), seen), params)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)


def test_presence_and_frequency_penalties_follow_openais_formula() -> None:
    """mu[j] -> mu[j] - c[j] * frequency - [c[j] > 0] * presence, c[j] the count of token j generated so far."""
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    counts = torch.tensor([[0, 1, 3, 0]])
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    got = penalize(logits, params, counts, counts > 0)
    assert got.tolist() == [[1.0, 2.0 - 0.25 - 0.5, 3.0 - 0.75 - 0.5, 4.0]]
    assert torch.equal(penalize(logits, SamplingParams(), counts, counts > 0), logits)  # no penalty: untouched


def test_min_p_keeps_the_tokens_at_least_min_p_times_as_likely_as_the_likeliest() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.06, 0.04]]))
    kept = sampling_distribution(logits, temperature=1.0, min_p=0.15) > 0  # 0.15 * 0.5 = 0.075
    assert kept.tolist() == [[True, True, True, False, False]]


def test_sampling_params_are_frozen_normalised_and_greedy_below_a_tiny_temperature() -> None:
    params = SamplingParams(temperature=1e-300, top_k=0, top_p=1.0, min_p=0.0, stop="###")
    assert params.greedy and params.top_k is None and params.top_p is None and params.min_p is None
    assert params.stop == ("###",) and not params.penalized and not params.filtered
    with pytest.raises(AttributeError):
        params.temperature = 1.0  # type: ignore[misc]
    assert sample_next(torch.tensor([[0.0, 5.0, 1.0]]), params).tolist() == [1]  # no overflow, no NaN
    assert SamplingParams.of(params, temperature=0.5).temperature == 0.5 and params.temperature == 0.0
    with pytest.raises(QkvError, match="unknown sampling setting tempreature"):
        SamplingParams.of(tempreature=0.5)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=math.nan), "temperature"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(presence_penalty=3), "presence_penalty"),
        (dict(frequency_penalty=math.nan), "frequency_penalty"),
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(stop=["ok", ""]), "stop"),
        (dict(seed=-1), "seed"),
        (dict(logprobs=True), "logprobs"),
    ],
)
def test_bad_sampling_settings_raise_qkv_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(QkvError, match=words):
        sample_next(torch.zeros(1, 4), **kwargs)
