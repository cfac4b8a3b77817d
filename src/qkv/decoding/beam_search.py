"""Translating with an encoder-decoder Transformer: greedy decoding and beam search (the encoder-decoder study notes).

The encoder reads the source sentence once; its output ("memory") never changes while the target is
written, so :meth:`Transformer.encode` runs once per batch. The decoder then starts from ``<bos>`` and
produces one token at a time: each step feeds only the newest token, its masked self-attention reads the
keys and values of the earlier target tokens from the KV cache, and its cross-attention queries read the
keys and values of the encoder output, which the cache computes at the first step and keeps ("static").

**Greedy** takes the most likely next token at every step. **Beam search** keeps the ``beam_size`` most
likely partial translations (beams) of each sentence instead of one. A step extends every beam by every
token, and of those candidates (ranked by summed log-probability) the best ``beam_size`` that do not end
in ``<eos>`` become the next beams, while a candidate ending in ``<eos>`` that ranks among the best
``beam_size`` becomes a finished hypothesis (fairseq's rule; with one beam this is exactly greedy). The B
sentences x beam_size beams run as one batch of B * beam_size rows; the memory and its padding mask are
repeated per beam, and ``cache.reorder`` makes each row's cached keys and values follow its beam.

**Scores.** A hypothesis's ``log_prob`` is the sum of log P(token | source, tokens before it) over the
generated tokens, ``<eos>`` included. Finished hypotheses are ranked by the length-normalised score
``log_prob / length ** length_penalty`` (fairseq, Marian), where ``length`` counts the generated tokens
including ``<eos>``. ``length_penalty=0`` ranks by raw log-probability, which favours short outputs;
1 is the average log-probability per token; larger values favour longer outputs still.

**Stopping.** A sentence stops when it holds ``beam_size`` finished hypotheses and its best beam, scored at
its current length, is no better than the worst of them (Hugging Face's rule). As log-probabilities only
fall, with ``length_penalty=0`` this stop loses nothing: running on could not change the result. With
``length_penalty > 0`` it is the usual heuristic. A sentence also stops at its maximum length, where its
beams are finalised without ``<eos>``.

**Maximum length.** A sentence with ``n`` source tokens (its non-padding tokens) gets at most
``min(int(max_len_a * n + max_len_b), model.config.context_length - 1, max_len)`` generated tokens (``<eos>``
included), and at least 1 (fairseq's ``ax + b`` rule; the ``- 1`` keeps ``<bos>`` plus the output within
the model's positions). The defaults ``max_len_a=1.5, max_len_b=10`` leave room for a translation a good
deal longer than its source.

>>> translate_batch(model, src_ids, src_padding_mask, bos_id=1, eos_id=2, beam_size=4)  # doctest: +SKIP
[[15, 27, 9], [8, 41]]
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from qkv.decoding.configs import translator_config
from qkv.decoding.fast_step import resolve_step
from qkv.decoding.sessions import translation_session
from qkv.errors import QkvError
from qkv.models.eval_mode import eval_mode
from qkv.models.transformer import Transformer

if TYPE_CHECKING:
    from qkv.models.rnnsearch import RNNSearch


@dataclass
class Hypothesis:
    """One translation found by beam search: target ids (no ``<bos>``/``<eos>``) and its scores."""

    tokens: list[int]
    score: float  # log_prob / length ** length_penalty, used for ranking
    log_prob: float  # sum of the log-probabilities of the generated tokens (<eos> included)
    reached_eos: bool = True  # False: cut at the maximum length without <eos>

    @property
    def length(self) -> int:
        """Generated tokens, ``<eos>`` included: the length in the score's denominator."""
        return len(self.tokens) + int(self.reached_eos)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _prepare(
    model: Transformer | RNNSearch,
    src_ids: Tensor,
    src_padding_mask: Tensor | None,
    bos_id: int,
    eos_id: int,
    max_len: int | None,
    max_len_a: float,
    max_len_b: float,
) -> tuple[Tensor, Tensor | None, list[int]]:
    """Check the arguments; return source ids (B, S) and mask on the model's device, and each sentence's limit."""
    config = translator_config(model)
    vocab = config.tgt_vocab_size
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if not _whole(value) or not 0 <= value < vocab:
            raise QkvError(f"{name}={value!r} is not a target token id (0..{vocab - 1}): pass the tokenizer's {name}")
    if max_len is not None and (not _whole(max_len) or max_len < 1):
        raise QkvError(f"max_len={max_len!r} must be a whole number >= 1: e.g. max_len=100, or None for no extra cap")
    for name, number in (("max_len_a", max_len_a), ("max_len_b", max_len_b)):
        if not _finite(number) or number < 0:
            raise QkvError(f"{name}={number!r} must be a finite number >= 0: e.g. max_len_a=1.5, max_len_b=10")
    if not isinstance(src_ids, Tensor) or src_ids.dtype.is_floating_point or src_ids.dtype == torch.bool:
        raise QkvError("src_ids must be a (batch, length) tensor of token ids: encode and pad the source sentences")
    device = next(model.parameters()).device
    src_ids = src_ids.to(device=device, dtype=torch.long)
    if src_ids.dim() == 1:
        src_ids = src_ids[None]  # (S,) -> (1, S)
    if src_ids.dim() != 2:
        raise QkvError(f"src_ids has shape {tuple(src_ids.shape)}: pass a (batch, length) tensor of token ids")
    if src_ids.numel() and not 0 <= int(src_ids.min()) <= int(src_ids.max()) < config.src_vocab_size:
        raise QkvError(
            f"src_ids hold ids outside the source vocabulary (0..{config.src_vocab_size - 1}): "
            "encode the source with the model's tokenizer"
        )
    if src_padding_mask is not None:
        src_padding_mask = src_padding_mask.to(device=device, dtype=torch.bool)
        if src_padding_mask.dim() == 1:
            src_padding_mask = src_padding_mask[None]  # (S,) -> (1, S)
        if src_padding_mask.shape != src_ids.shape:
            raise QkvError(f"src_padding_mask must have the shape of src_ids {tuple(src_ids.shape)}: True at padding")
    batch, length = src_ids.shape
    src_lens = (~src_padding_mask).sum(1).tolist() if src_padding_mask is not None else [length] * batch
    cap = min(config.context_length - 1, max_len) if max_len is not None else config.context_length - 1
    limits = [max(1, min(int(max_len_a * n + max_len_b), cap)) for n in src_lens]
    return src_ids, src_padding_mask, limits


def _log_probs(logits: Tensor) -> Tensor:
    """log softmax over the vocabulary, in at least float32."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def greedy_decode(
    model: Transformer | RNNSearch,
    src_ids: Tensor,
    src_padding_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    max_len: int | None = None,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    step: str = "auto",
) -> list[list[int]]:
    """The most likely next token at every step; returns each sentence's target ids (no ``<bos>``/``<eos>``).

    ``src_ids`` (B, S) with ``src_padding_mask`` (B, S) True at padding. Lengths as in the module docstring.
    ``step`` chooses how the decoder steps run (:mod:`qkv.decoding.fast_step`).
    """
    src_ids, mask, limits = _prepare(model, src_ids, src_padding_mask, bos_id, eos_id, max_len, max_len_a, max_len_b)
    resolve_step(model, step)
    batch, steps = src_ids.shape[0], max(limits)
    limit = torch.tensor(limits, device=src_ids.device)  # (B,)
    with eval_mode(model):
        memory = model.encode(src_ids, src_padding_mask=mask)  # (B, S, d_model), once
        # <bos> and at most steps - 1 generated tokens are fed
        with translation_session(model, step, memory, mask, steps) as session:
            tokens = src_ids.new_full((batch, steps), eos_id)  # (B, L)
            done = torch.zeros(batch, dtype=torch.bool, device=src_ids.device)
            next_ids = src_ids.new_full((batch,), bos_id)
            for t in range(steps):
                logits = session.step(next_ids)  # (B, V)
                next_ids = _log_probs(logits).argmax(dim=-1).masked_fill(done, eos_id)  # (B,)
                tokens[:, t] = next_ids
                done |= (next_ids == eos_id) | (t + 1 >= limit)
                if bool(done.all()):
                    break
    out = []
    for row, n in zip(tokens.tolist(), limits, strict=True):
        row = row[:n]
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def _check_beam(beam_size: int, n_best: int, length_penalty: float) -> None:
    if not _whole(beam_size) or beam_size < 1:
        raise QkvError(f"beam_size={beam_size!r} must be a whole number >= 1: e.g. 4 (1 is greedy decoding)")
    if not _whole(n_best) or not 1 <= n_best <= beam_size:
        raise QkvError(
            f"n_best={n_best!r} must be between 1 and beam_size={beam_size}: lower n_best or raise beam_size"
        )
    if not _finite(length_penalty):
        raise QkvError(
            f"length_penalty={length_penalty!r} must be a finite number: e.g. 1.0, or 0 for raw log-probabilities"
        )


def beam_search(
    model: Transformer | RNNSearch,
    src_ids: Tensor,
    src_padding_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    n_best: int = 1,
    max_len: int | None = None,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    step: str = "auto",
) -> list[list[Hypothesis]]:
    """The ``n_best`` best hypotheses of each sentence, best first (see the module docstring).

    ``src_ids`` (B, S) with ``src_padding_mask`` (B, S) True at padding. A sentence gets fewer than
    ``n_best`` hypotheses only when fewer distinct target sequences fit in its maximum length. ``step``
    chooses how the decoder steps run (:mod:`qkv.decoding.fast_step`).
    """
    _check_beam(beam_size, n_best, length_penalty)
    resolve_step(model, step)
    src_ids, mask, limits = _prepare(model, src_ids, src_padding_mask, bos_id, eos_id, max_len, max_len_a, max_len_b)
    k, batch, steps = beam_size, src_ids.shape[0], max(limits)
    beams = _Beams(src_ids, k, translator_config(model).tgt_vocab_size, eos_id, length_penalty, limits)
    with eval_mode(model), ExitStack() as stack:
        memory = model.encode(src_ids, src_padding_mask=mask)  # (B, S, d_model), once
        # B sentences x k beams as B*k rows: beam j of sentence b is row b*k + j
        session = stack.enter_context(translation_session(model, step, memory, mask, steps, group=k))
        next_ids = src_ids.new_full((batch * k,), bos_id)  # (B*k,)
        for t in range(steps):
            log_probs = _log_probs(session.step(next_ids)).view(batch, k, beams.vocab)  # (B, k, V)
            beam, token = beams.extend(log_probs)  # (B, k) each
            session.reorder((beams.first + beam).view(-1))  # each row's cache follows its beam
            next_ids = token.view(-1)  # (B*k,)
            if beams.stop(t):
                break
    return [hyps[:n_best] for hyps in beams.finished]


class _Beams:
    """The ``k`` beams of each of B sentences in beam search: their summed log-probabilities (``scores``), their
    tokens (``history``), and each sentence's best finished hypotheses (``finished``), with the module docstring's
    rules for finishing and stopping."""

    def __init__(
        self, src_ids: Tensor, k: int, vocab: int, eos_id: int, length_penalty: float, limits: list[int]
    ) -> None:
        batch, device = src_ids.shape[0], src_ids.device
        self.k, self.vocab, self.eos_id, self.length_penalty, self.limits = k, vocab, eos_id, length_penalty, limits
        self.n_cand = min(2 * k, k * vocab)  # each beam has one <eos> candidate, so 2k hold k others (vocab >= 2)
        self.finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self.first = torch.arange(batch, device=device)[:, None] * k  # (B, 1): row of each sentence's beam 0
        self.scores = torch.full((batch, k), float("-inf"), device=device)  # (B, k) summed log-probs
        self.scores[:, 0] = 0.0  # all beams start as <bos>: keep one, or the first step would pick k copies
        self.history = src_ids.new_empty(batch, k, 0)  # (B, k, t) generated tokens of each beam

    def finish(self, b: int, tokens: list[int], log_prob: float, reached_eos: bool) -> None:
        """Add a hypothesis of sentence ``b``, scored log_prob / length ** length_penalty; keep the best k."""
        length = len(tokens) + int(reached_eos)
        self.finished[b].append(Hypothesis(tokens, log_prob / length**self.length_penalty, log_prob, reached_eos))
        self.finished[b].sort(key=lambda h: -h.score)  # stable: earlier (shorter) first on ties
        del self.finished[b][self.k :]

    def extend(self, log_probs: Tensor) -> tuple[Tensor, Tensor]:
        """One step from the log-probabilities (B, k, V) of every beam's next token: candidates ending in <eos>
        among the best k finish, the best k others become the beams. Returns which old beam each new one extends
        and with which token, (B, k) each."""
        batch, k, vocab = log_probs.shape
        candidates = (self.scores.to(log_probs.dtype)[:, :, None] + log_probs).view(batch, k * vocab)  # (B, k*V)
        top, index = candidates.topk(self.n_cand, dim=1)  # (B, n_cand), best first
        beam, token = index // vocab, index % vocab  # which beam each candidate extends, with which token
        is_eos = token == self.eos_id  # (B, n_cand)

        # Candidates ending in <eos> among the best k finish (`history` still holds the beams they extend).
        for b, r in (is_eos[:, :k] & top[:, :k].isfinite()).nonzero().tolist():
            if not self.done[b]:
                self.finish(b, self.history[b, beam[b, r]].tolist(), float(top[b, r]), True)

        # The best k candidates not ending in <eos> are the new beams.
        pick = is_eos.to(torch.uint8).argsort(dim=1, stable=True)[:, :k]  # (B, k): non-eos first, by rank
        self.scores = top.gather(1, pick).masked_fill(is_eos.gather(1, pick), float("-inf"))  # (B, k)
        beam, token = beam.gather(1, pick), token.gather(1, pick)  # (B, k)
        kept = self.history.gather(1, beam[:, :, None].expand_as(self.history))  # (B, k, t)
        self.history = torch.cat([kept, token[:, :, None]], dim=2)  # (B, k, t + 1)
        return beam, token

    def stop(self, t: int) -> bool:
        """After step ``t``: a sentence at its maximum length finishes its beams without <eos>; one whose best
        beam cannot beat its k finished hypotheses (or that has no live beam) stops. True when all have stopped."""
        best_live = self.scores.max(dim=1).values.tolist()  # (B,)
        for b in range(len(self.done)):
            if self.done[b]:
                continue
            if t + 1 >= self.limits[b]:  # maximum length: the beams finish without <eos>
                for j in range(self.k):
                    if self.scores[b, j].isfinite():
                        self.finish(b, self.history[b, j].tolist(), float(self.scores[b, j]), False)
                self.done[b] = True
            elif best_live[b] == -math.inf or (
                len(self.finished[b]) == self.k
                and best_live[b] / (t + 1) ** self.length_penalty <= self.finished[b][-1].score
            ):
                self.done[b] = True
        return all(self.done)


def translate_batch(
    model: Transformer | RNNSearch,
    src_ids: Tensor,
    src_padding_mask: Tensor | None = None,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int = 4,
    length_penalty: float = 1.0,
    max_len: int | None = None,
    max_len_a: float = 1.5,
    max_len_b: float = 10,
    step: str = "auto",
) -> list[list[int]]:
    """Each sentence's best translation as target ids: greedy for ``beam_size=1``, beam search otherwise."""
    _check_beam(beam_size, 1, length_penalty)
    if beam_size == 1:
        return greedy_decode(
            model,
            src_ids,
            src_padding_mask,
            bos_id=bos_id,
            eos_id=eos_id,
            max_len=max_len,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            step=step,
        )
    best = beam_search(
        model,
        src_ids,
        src_padding_mask,
        bos_id=bos_id,
        eos_id=eos_id,
        beam_size=beam_size,
        length_penalty=length_penalty,
        max_len=max_len,
        max_len_a=max_len_a,
        max_len_b=max_len_b,
        step=step,
    )
    return [hyps[0].tokens for hyps in best]
