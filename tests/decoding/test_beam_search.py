"""Translation decoding: greedy equals an uncached reference loop, batching equals one sentence at a time,
beam 1 equals greedy, a wide beam equals exhaustive search, scores equal teacher-forced log-probabilities,
the length penalty and the maximum-length rule, and bad arguments."""

from __future__ import annotations

import itertools
import math
from functools import cache
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor, nn

from qkv.decoding.beam_search import Hypothesis, beam_search, greedy_decode, translate_batch
from qkv.errors import QkvError
from qkv.models import Transformer, TransformerConfig

SRC_VOCAB, TGT_VOCAB, MAX_LEN = 20, 12, 32
PAD, BOS = 0, 1
LENGTHS = (7, 2, 5, 1, 6)  # source sentences of different lengths, padded into one batch


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest (tests/conftest.py)


@cache
def tiny_transformer(seed: int, tgt_vocab: int = TGT_VOCAB, dtype: torch.dtype = torch.float64, **extra) -> Transformer:
    """A tiny random post-LN Transformer. Its FFN and attention query/key weights are scaled up by 3: at the
    default initialisation a random decoder mostly repeats one token, and varied outputs make beams diverge.
    float64 keeps near-ties between logits from flipping an argmax between two equal computations."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        src_vocab_size=SRC_VOCAB,
        tgt_vocab_size=tgt_vocab,
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        context_length=MAX_LEN,
        norm_first=False,
        positional="sinusoidal",
        scale_embeddings=True,
        **extra,
    )
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "linear" in name or ".query." in name or ".key." in name:
                param.mul_(3)
    return model.to(dtype).eval()


def padded_batch(seed: int, lengths: tuple[int, ...] = LENGTHS) -> tuple[Tensor, Tensor]:
    """Random source ids (B, S) padded with PAD, and the padding mask (B, S), True at padding."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(1, SRC_VOCAB, (n,), generator=gen)
    return src, src == PAD


def expected_limit(n_src: int, a: float, b: float, max_len: int | None = None) -> int:
    return max(1, min(int(a * n_src + b), MAX_LEN - 1, max_len if max_len is not None else MAX_LEN))


def cut_at(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos)] if eos in tokens else tokens


@torch.no_grad()
def reference_argmax(model: Transformer, src: Tensor, mask: Tensor, steps: int) -> list[list[int]]:
    """``steps`` argmax tokens per sentence, never stopping, re-running the whole model each step (no cache)."""
    tgt = torch.full((src.shape[0], 1), BOS)
    for _ in range(steps):
        logits = model(src, tgt, src_padding_mask=mask)  # (B, T, V): encoder and decoder from scratch
        tgt = torch.cat([tgt, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tgt[:, 1:].tolist()


def pick_eos(sequences: list[list[int]]) -> int:
    """A token that some sequences produce after their first step and some never do: eos then stops some early."""
    for token in range(TGT_VOCAB):
        inside = [token in seq[1:] for seq in sequences]
        if token != BOS and any(inside) and not all(token in seq for seq in sequences):
            return token
    return next(t for t in range(TGT_VOCAB) if t != BOS)


@torch.no_grad()
def teacher_forced_log_prob(model: nn.Module, src_row: Tensor, hyp: Hypothesis, eos: int) -> float:
    """log P(hypothesis | source) from one full forward pass over [bos] + tokens (+ eos), source unpadded."""
    target = hyp.tokens + [eos] * hyp.reached_eos
    logits = model(src_row[None], torch.tensor([[BOS] + target[:-1]]))  # (1, T, V)
    return float(torch.log_softmax(logits[0].double(), -1).gather(1, torch.tensor(target)[:, None]).sum())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("a", "b"), [(1.0, 3), (1.5, 10)])
def test_greedy_equals_uncached_reference(seed: int, a: float, b: float, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_transformer(seed)
    src, mask = padded_batch(seed)
    limits = [expected_limit(n, a, b) for n in LENGTHS]
    full = reference_argmax(model, src, mask, max(limits))
    eos = pick_eos(full)
    expected = [cut_at(seq[:n], eos) for seq, n in zip(full, limits, strict=True)]
    encodes: list[int] = []
    encode = model.encode
    monkeypatch.setattr(model, "encode", lambda *args, **kw: encodes.append(1) or encode(*args, **kw))
    assert greedy_decode(model, src, mask, bos_id=BOS, eos_id=eos, max_len_a=a, max_len_b=b) == expected
    assert len(encodes) == 1  # the encoder runs once per batch
    if seed == 0:  # the case is not trivial: eos stops some sentences, the length limit others
        assert any(len(e) < n for e, n in zip(expected, limits, strict=True))
        assert any(len(e) == n for e, n in zip(expected, limits, strict=True))


@pytest.mark.parametrize("seed", range(3))
def test_batch_equals_each_sentence_alone(seed: int) -> None:
    model, eos = tiny_transformer(seed), 2
    src, mask = padded_batch(seed + 10)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=eos)
    beams = beam_search(model, src, mask, bos_id=BOS, eos_id=eos, beam_size=3, n_best=3)
    for i, n in enumerate(LENGTHS):
        alone = src[i : i + 1, :n]  # (1, n), no padding
        assert greedy_decode(model, alone, None, bos_id=BOS, eos_id=eos) == [greedy[i]]
        (hyps,) = beam_search(model, alone, None, bos_id=BOS, eos_id=eos, beam_size=3, n_best=3)
        assert [h.tokens for h in hyps] == [h.tokens for h in beams[i]]
        assert [h.score for h in hyps] == pytest.approx([h.score for h in beams[i]], abs=1e-9)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_beam_of_one_equals_greedy(seed: int, length_penalty: float) -> None:
    model = tiny_transformer(seed)
    src, mask = padded_batch(seed + 20)
    eos = pick_eos(reference_argmax(model, src, mask, 12))
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=eos, max_len=12)
    beams = beam_search(
        model, src, mask, bos_id=BOS, eos_id=eos, beam_size=1, max_len=12, length_penalty=length_penalty
    )
    assert [hyps[0].tokens for hyps in beams] == greedy
    assert all(len(hyps) == 1 for hyps in beams)


@torch.no_grad()
def exhaustive(model: Transformer, src_row: Tensor, eos: int, max_len: int, length_penalty: float) -> list[Hypothesis]:
    """Every target sequence that fits in max_len (ended by eos, or max_len tokens without it), best first."""
    others = [t for t in range(model.config.tgt_vocab_size) if t != eos]
    targets = [list(p) + [eos] for n in range(max_len) for p in itertools.product(others, repeat=n)]
    targets += [list(p) for p in itertools.product(others, repeat=max_len)]
    inputs = torch.tensor([([BOS] + t[:-1] + [PAD] * max_len)[:max_len] for t in targets])  # (N, L), causal
    memory = model.encode(src_row[None]).expand(len(targets), -1, -1)
    log_probs = torch.log_softmax(model.decode(inputs, memory).double(), -1)  # (N, L, V)
    hyps = []
    for t, row in zip(targets, log_probs, strict=True):
        log_prob = float(row[torch.arange(len(t)), torch.tensor(t)].sum())
        reached_eos = t[-1] == eos
        tokens = t[:-1] if reached_eos else t
        hyps.append(Hypothesis(tokens, log_prob / len(t) ** length_penalty, log_prob, reached_eos))
    return sorted(hyps, key=lambda h: -h.score)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("length_penalty", [0.0, 0.5, 1.0, 2.0])
def test_wide_beam_equals_exhaustive_search(seed: int, length_penalty: float) -> None:
    """With 4 target tokens and 3 steps there are 1 + 3 + 9 + 27 = 40 complete sequences: a beam of 40 keeps
    every one, so its n-best list must be the exhaustive ranking (this also checks the stopping rule)."""
    model, eos, steps = tiny_transformer(seed, tgt_vocab=4), 2, 3
    src, mask = padded_batch(seed + 30, (5, 2, 4))
    beams = beam_search(
        model,
        src,
        mask,
        bos_id=BOS,
        eos_id=eos,
        beam_size=40,
        n_best=40,
        length_penalty=length_penalty,
        max_len=steps,
    )
    for i, n in enumerate((5, 2, 4)):
        brute = exhaustive(model, src[i, :n], eos, steps, length_penalty)
        assert [(h.tokens, h.reached_eos) for h in beams[i]] == [(h.tokens, h.reached_eos) for h in brute]
        assert [h.score for h in beams[i]] == pytest.approx([h.score for h in brute], abs=1e-9)
        assert [h.log_prob for h in beams[i]] == pytest.approx([h.log_prob for h in brute], abs=1e-9)


@pytest.mark.parametrize("length_penalty", [0.0, 0.6, 1.0])
def test_n_best_are_distinct_sorted_and_scored_by_the_model(length_penalty: float) -> None:
    model, eos = tiny_transformer(5, dtype=torch.float32), 3  # the default precision
    src, mask = padded_batch(5)
    beams = beam_search(model, src, mask, bos_id=BOS, eos_id=eos, beam_size=5, n_best=5, length_penalty=length_penalty)
    for i, hyps in enumerate(beams):
        assert len(hyps) == 5
        assert len({tuple(h.tokens) for h in hyps}) == 5
        assert all(x.score >= y.score for x, y in zip(hyps, hyps[1:], strict=False))
        for h in hyps:
            assert h.length == len(h.tokens) + h.reached_eos
            assert h.score == pytest.approx(h.log_prob / h.length**length_penalty, abs=1e-6)
            assert h.log_prob == pytest.approx(teacher_forced_log_prob(model, src[i, : LENGTHS[i]], h, eos), abs=1e-4)


class PrefixCache:
    """Stand-in KV cache: remembers each row's fed tokens and follows the beams like the real one."""

    def __init__(self) -> None:
        self.tokens: Tensor | None = None  # (B, t)

    def reorder(self, index: Tensor) -> None:
        assert self.tokens is not None
        self.tokens = self.tokens.index_select(0, index)


class TableModel(nn.Module):
    """A decoder whose next-token probabilities depend only on the target prefix, as given by a table."""

    def __init__(self, table: dict[tuple[int, ...], list[float]], default: list[float]) -> None:
        super().__init__()
        self.table, self.default = table, default
        self.config = SimpleNamespace(src_vocab_size=SRC_VOCAB, tgt_vocab_size=len(default), context_length=MAX_LEN)
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the device
        self.grad_enabled: list[bool] = []

    def encode(self, src_ids: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        return torch.zeros(*src_ids.shape, 1)

    def new_cache(self, max_len: int | None = None) -> PrefixCache:
        return PrefixCache()

    def decode(self, tgt_ids: Tensor, memory: Tensor, *, cache: PrefixCache, last_only: bool, **_) -> Tensor:
        self.grad_enabled.append(torch.is_grad_enabled())
        cache.tokens = tgt_ids if cache.tokens is None else torch.cat([cache.tokens, tgt_ids], dim=1)
        probs = [self.table.get(tuple(row[1:]), self.default) for row in cache.tokens.tolist()]
        return torch.tensor(probs, dtype=torch.float64).log()[:, None]  # (B, 1, V)


EOS_T, BOS_T, A, B = 0, 1, 2, 3
TABLE = {  # P(eos), P(bos), P(A), P(B) after a prefix
    (): [0.5, 1e-9, 0.45, 0.05],
    (A,): [0.04, 1e-9, 0.06, 0.9],
    (A, B): [0.9, 1e-9, 0.05, 0.05],
}
DEFAULT = [0.8, 1e-9, 0.1, 0.1]


@pytest.mark.parametrize(("length_penalty", "ranking"), [(0.0, [[], [A, B]]), (1.0, [[A, B], []])])
def test_length_penalty_changes_the_ranking(length_penalty: float, ranking: list[list[int]]) -> None:
    """[eos] has log-prob log .5 = -0.69; [A, B, eos] has log .45 + 2 log .9 = -1.01, but -0.34 per token.

    Also the stopping rule: after two steps the two finished are [] and [B]; stopping there (fairseq's rule)
    would miss [A, B], which the live beam A B can still beat them with."""
    model = TableModel(TABLE, DEFAULT)
    src = torch.ones(1, 4, dtype=torch.long)
    kwargs = dict(bos_id=BOS_T, eos_id=EOS_T, beam_size=2, length_penalty=length_penalty)
    hyps = beam_search(model, src, None, n_best=2, **kwargs)[0]
    assert [h.tokens for h in hyps] == ranking
    assert translate_batch(model, src, None, **kwargs) == [ranking[0]]
    assert greedy_decode(model, src, None, bos_id=BOS_T, eos_id=EOS_T) == [[]]  # eos first: greedy stops at once
    assert not any(model.grad_enabled)


def test_eos_ends_the_translation() -> None:
    table = {(): [0.1, 1e-9, 0.8, 0.1], (A,): [0.1, 1e-9, 0.1, 0.8]}  # greedy: A, B, then the default's eos
    model = TableModel(table, DEFAULT)
    src = torch.tensor([[5, 6, 7], [5, PAD, PAD]])
    assert greedy_decode(model, src, src == PAD, bos_id=BOS_T, eos_id=EOS_T) == [[A, B], [A, B]]
    (best,) = beam_search(model, src[:1], None, bos_id=BOS_T, eos_id=EOS_T, beam_size=3)[0]
    assert best.tokens == [A, B] and best.reached_eos
    assert best.log_prob == pytest.approx(math.log(0.8 * 0.8 * 0.8))


@pytest.mark.parametrize(("a", "b", "max_len"), [(1.5, 2, None), (4.0, 10, None), (1.0, 0, None), (2.0, 5, 4)])
def test_maximum_length_rule(a: float, b: float, max_len: int | None) -> None:
    """With eos never predicted, every output is exactly as long as the ax + b rule and the model allow."""
    model = tiny_transformer(7, final_logits_bias=True)
    eos = 2
    with torch.no_grad():
        model.unembedding.bias[eos] = -1e4
    src, mask = padded_batch(7)
    limits = [expected_limit(n, a, b, max_len) for n in LENGTHS]
    lengths = dict(max_len=max_len, max_len_a=a, max_len_b=b)
    assert [len(t) for t in greedy_decode(model, src, mask, bos_id=BOS, eos_id=eos, **lengths)] == limits
    beams = beam_search(model, src, mask, bos_id=BOS, eos_id=eos, beam_size=3, n_best=3, **lengths)
    assert [[len(h.tokens) for h in hyps] for hyps in beams] == [[n] * 3 for n in limits]
    assert not any(h.reached_eos for hyps in beams for h in hyps)
    assert [len(t) for t in translate_batch(model, src, mask, bos_id=BOS, eos_id=eos, **lengths)] == limits


def test_translate_batch_picks_greedy_or_beam_and_restores_training() -> None:
    model = tiny_transformer(8, dropout=0.3)
    src, mask = padded_batch(8)
    greedy = greedy_decode(model, src, mask, bos_id=BOS, eos_id=2)
    beams = beam_search(model, src, mask, bos_id=BOS, eos_id=2, beam_size=3, length_penalty=0.5)
    model.train()
    try:  # dropout is off while decoding, and the training flag comes back
        assert translate_batch(model, src, mask, bos_id=BOS, eos_id=2, beam_size=1) == greedy
        assert model.training
        best = translate_batch(model, src, mask, bos_id=BOS, eos_id=2, beam_size=3, length_penalty=0.5)
        assert best == [hyps[0].tokens for hyps in beams]
        assert model.training
    finally:
        model.eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"beam_size": 0},
        {"beam_size": 2, "n_best": 3},
        {"n_best": 0},
        {"max_len_a": -1.0},
        {"max_len_b": -1},
        {"max_len": 0},
        {"eos_id": TGT_VOCAB},
        {"bos_id": -1},
        {"length_penalty": float("nan")},
        {"length_penalty": float("inf")},
        {"max_len_a": float("inf")},
    ],
)
def test_bad_arguments_raise_qkv_error(kwargs: dict) -> None:
    model = tiny_transformer(0)
    src, mask = padded_batch(0)
    args = {"bos_id": BOS, "eos_id": 2, **kwargs}
    with pytest.raises(QkvError, match=": "):
        beam_search(model, src, mask, **args)
    if "beam_size" not in kwargs and "n_best" not in kwargs and "length_penalty" not in kwargs:
        with pytest.raises(QkvError):
            greedy_decode(model, src, mask, **args)


def test_bad_sources_raise_qkv_error() -> None:
    model = tiny_transformer(0)
    src, mask = padded_batch(0)  # (5, 7)
    for bad_src, bad_mask in [
        (src.float(), mask),  # not token ids
        (src + SRC_VOCAB, mask),  # outside the source vocabulary
        (src, mask[:, :6]),  # mask of another shape
        (src[:2, :6], mask[:3, :4]),  # same number of entries, other shape
        (src[None], None),  # 3-D
    ]:
        for decode in (greedy_decode, beam_search):
            with pytest.raises(QkvError):
                decode(model, bad_src, bad_mask, bos_id=BOS, eos_id=2)
    assert greedy_decode(model, src[0], mask[0], bos_id=BOS, eos_id=2) == greedy_decode(
        model, src[:1], mask[:1], bos_id=BOS, eos_id=2
    )  # one sentence as a (S,) tensor
