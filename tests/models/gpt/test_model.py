"""GPT: causality, KV-cache equality, padding, context limits, tied embeddings."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.errors import QkvError
from qkv.models import GPT
from tests.conftest import tiny_gpt as shared_tiny_gpt

VOCAB = 37


def tiny_gpt(positional: str = "rope", **kw) -> GPT:
    return shared_tiny_gpt(vocab_size=VOCAB, context_length=24, positional=positional, seed=None, dtype=torch.float32,
                           init_std=None, **kw)  # fmt: skip


MODELS = {p: tiny_gpt(p) for p in ("rope", "learned", "sinusoidal")}
MODELS["post-ln"] = tiny_gpt("learned", norm_first=False)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(sorted(MODELS)),
    tokens=st.lists(st.integers(0, VOCAB - 1), min_size=2, max_size=24),
    t=st.integers(0, 22),
    replacement=st.integers(0, VOCAB - 1),
)
def test_changing_later_tokens_never_changes_earlier_outputs(kind, tokens, t, replacement) -> None:
    model = MODELS[kind]
    t = t % (len(tokens) - 1)
    changed = list(tokens)
    changed[t + 1 :] = [replacement] * (len(tokens) - t - 1)
    with torch.no_grad():
        a, b = model(torch.tensor([tokens])), model(torch.tensor([changed]))
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], atol=1e-5, rtol=0)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(sorted(MODELS)),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10),
    continuation=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12),
)
def test_cached_incremental_decoding_equals_full_recomputation(kind, prompt, continuation) -> None:
    model = MODELS[kind]
    sequence = torch.tensor([prompt + continuation])
    with torch.no_grad():
        full = model(sequence)
        cache = model.new_cache()
        steps = [model(sequence[:, : len(prompt)], cache=cache)]
        for i in range(len(prompt), sequence.shape[1]):
            steps.append(model(sequence[:, i : i + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)


def test_batched_with_padding_equals_one_by_one() -> None:
    model = MODELS["learned"]
    sequences = [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]]
    batch = torch.zeros(3, 5, dtype=torch.long)
    padding = torch.ones(3, 5, dtype=torch.bool)
    for i, seq in enumerate(sequences):
        batch[i, : len(seq)] = torch.tensor(seq)
        padding[i, : len(seq)] = False
    with torch.no_grad():
        batched = model(batch, key_padding_mask=padding)
        for i, seq in enumerate(sequences):
            alone = model(torch.tensor([seq]))
            torch.testing.assert_close(batched[i, : len(seq)], alone[0], atol=1e-5, rtol=0)


def test_last_only_gives_the_last_position() -> None:
    model = MODELS["rope"]
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, last_only=True)[:, 0], model(ids)[:, -1])


def test_at_gives_one_chosen_position_per_row() -> None:
    model = MODELS["rope"]
    ids = torch.randint(0, VOCAB, (3, 9))
    at = torch.tensor([8, 0, 4])
    with torch.no_grad():
        full = model(ids)
        torch.testing.assert_close(model(ids, at=at)[:, 0], full[torch.arange(3), at])


def test_too_long_input_is_a_clear_error() -> None:
    with pytest.raises(QkvError, match="context of 24"):
        MODELS["rope"](torch.zeros(1, 25, dtype=torch.long))


def test_tied_embeddings_share_one_matrix() -> None:
    model = MODELS["rope"]
    assert model.unembedding.weight is model.embedding.token_embedding.weight
    untied = tiny_gpt(tie_embeddings=False)
    assert untied.unembedding.weight is not untied.embedding.token_embedding.weight
    assert untied.num_parameters() == model.num_parameters() + VOCAB * 32


def test_eval_is_deterministic_and_dropout_acts_in_training() -> None:
    model = tiny_gpt("learned", dropout=0.5)
    ids = torch.randint(0, VOCAB, (1, 8))
    model.eval()
    torch.testing.assert_close(model(ids), model(ids))
    model.train()
    assert not torch.allclose(model(ids), model(ids))
