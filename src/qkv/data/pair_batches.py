"""Batches for the encoder-decoder: source sentences, and target sentences shifted by one token.

The encoder reads the whole source sentence at once. The decoder writes the target one token at a time,
starting from ``<bos>``; in training it is fed the true previous target token at every position (teacher
forcing), so all positions are learned in one pass behind a causal mask. A pair therefore becomes::

    src:     Two  dogs  play  .                           (the encoder's input; no bos/eos)
    tgt_in:  <bos>  Deux  chiens  jouent  .               (the decoder's input)
    tgt_out: Deux  chiens  jouent  .  <eos>               (what it must predict at each position)

Sentences of different lengths are padded with ``pad_id`` to the longest one in their batch; the padding
masks are True at the padding, so attention ignores those keys and the loss ignores those targets. To
waste little on padding, batches are built from sentences of similar length (as fairseq does): the pairs
are sorted by source length, then target length, and cut into consecutive batches of ``batch_size``
sentences, or of at most ``max_tokens`` padded tokens (``max(src_len, tgt_len + 1) * n_sentences``), or both.
Which pairs share a batch is fixed; the order of the batches is reshuffled every epoch with the object's
:class:`torch.Generator`, whose state goes into checkpoints for an exact resume.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from qkv.data.parallel import ParallelCorpus
from qkv.errors import QkvError
from qkv.tokenizers import Tokenizer

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # qkv's tokenizers' special ids


@dataclass
class TranslationBatch:
    """``B`` sentence pairs, padded: ``src`` (B, S), ``tgt_in`` and ``tgt_out`` (B, T), long tensors.

    ``tgt_in`` is ``[bos] + target`` and ``tgt_out`` is ``target + [eos]``; the padding masks are True at
    padding. ``n_target_tokens`` counts the real (non-padding) tokens of ``tgt_out``, the ones the loss
    sums over. ``indices`` (B,) are the pairs' positions in the corpus the batches were built from.
    """

    src: torch.Tensor
    src_padding_mask: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_padding_mask: torch.Tensor
    n_target_tokens: int
    indices: torch.Tensor

    def to(self, device: torch.device | str) -> TranslationBatch:
        """The same batch with its tensors on ``device`` (``indices`` stay on the CPU, for bookkeeping)."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("src", "src_padding_mask", "tgt_in", "tgt_out", "tgt_padding_mask"):
            moved[name] = moved[name].to(device)
        return TranslationBatch(**moved)

    def __len__(self) -> int:
        return self.src.shape[0]


class TranslationBatches:
    """Length-bucketed training batches and deterministic evaluation batches over sentence pairs.

    ``src_ids[i]`` and ``tgt_ids[i]`` are pair ``i`` already encoded, without bos/eos. Sources longer than
    ``max_len`` are cropped to ``max_len`` tokens and targets longer than ``max_len - 1`` to ``max_len - 1``
    (so ``tgt_in`` and ``tgt_out`` fit in ``max_len``); ``n_cropped`` pairs lost tokens that way
    (``n_cropped_sources`` and ``n_cropped_targets`` by side), for the caller to warn about.

    Attributes: ``src``, ``tgt`` (lists of 1-D long tensors after cropping), ``batches`` (lists of pair
    indices, in length order), ``epoch`` and ``position`` (the next batch is number ``position`` of epoch
    ``epoch``'s shuffled order), ``seed`` and ``generator``.
    """

    def __init__(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        *,
        pad_id: int = PAD_ID,
        bos_id: int = BOS_ID,
        eos_id: int = EOS_ID,
        batch_size: int | None = None,
        max_tokens: int | None = None,
        max_len: int | None = None,
        seed: int = 0,
    ) -> None:
        if len(src_ids) != len(tgt_ids):
            raise QkvError(
                f"there are {len(src_ids)} source sentences but {len(tgt_ids)} target sentences: "
                "give one target for every source"
            )
        if not src_ids:
            raise QkvError("there are no sentence pairs to batch: give a parallel corpus with at least one pair")
        _check_sizes(batch_size, max_tokens)
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 2):
            raise QkvError(f"max_len must be an integer of at least 2, got {max_len!r}: use e.g. 128")
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.batch_size, self.max_tokens, self.max_len, self.seed = batch_size, max_tokens, max_len, seed
        src_limit = max_len if max_len is not None else sys.maxsize
        tgt_limit = max_len - 1 if max_len is not None else sys.maxsize
        cropped = [(len(s) > src_limit, len(t) > tgt_limit) for s, t in zip(src_ids, tgt_ids, strict=True)]
        self.n_cropped_sources = sum(s for s, _ in cropped)
        self.n_cropped_targets = sum(t for _, t in cropped)
        self.n_cropped = sum(s or t for s, t in cropped)
        self.src = [torch.as_tensor(list(s[:src_limit]), dtype=torch.long) for s in src_ids]
        self.tgt = [torch.as_tensor(list(t[:tgt_limit]), dtype=torch.long) for t in tgt_ids]
        empty = next((i for i, s in enumerate(self.src) if len(s) == 0), None)
        if empty is not None:
            raise QkvError(
                f"source sentence {empty} has no tokens, so the encoder would have nothing to attend to: "
                "remove empty sources from the corpus"
            )
        self.batches = self._chunk(self._length_order(), batch_size, max_tokens)
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch, self.position = 0, 0
        self._orders: dict[int, torch.Tensor] = {}  # epoch -> order of the batches, drawn when first needed
        self._start_states: dict[int, torch.Tensor] = {}  # epoch -> generator state just before that draw

    @classmethod
    def from_corpus(
        cls,
        corpus: ParallelCorpus,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        **kwargs: Any,  # the constructor's keywords
    ) -> TranslationBatches:
        """Encode ``corpus`` (the target side with ``tgt_tokenizer``, by default the source's) and batch it;
        pad/bos/eos ids come from the target tokenizer. ``kwargs`` are the constructor's keywords."""
        tgt_tokenizer = tgt_tokenizer or src_tokenizer
        ids = {
            name: getattr(tgt_tokenizer, f"{name}_id")
            for name in ("pad", "bos", "eos")
            if getattr(tgt_tokenizer, f"{name}_id") is not None
        }
        return cls(
            src_tokenizer.encode_batch(corpus.sources),
            tgt_tokenizer.encode_batch(corpus.targets),
            **{f"{name}_id": value for name, value in ids.items()},
            **kwargs,
        )

    # ------------------------------------------------------------------------------------------ sizes

    @property
    def n_pairs(self) -> int:
        return len(self.src)

    @property
    def n_batches(self) -> int:
        """Batches per epoch."""
        return len(self.batches)

    def __len__(self) -> int:
        return self.n_batches

    # ---------------------------------------------------------------------------------------- batches

    def train_batch(self, *, rank: int = 0, world_size: int = 1) -> TranslationBatch:
        """The next training batch; after the last batch of an epoch comes the first of a reshuffled one.

        The epochs' shuffled orders, one after another, form one stream of batches. A call takes the next
        ``world_size`` batches of that stream and returns the one at offset ``rank``: with ``world_size``
        processes (same data, same seed, every rank calling once per step), rank ``r`` gets batch
        ``k * world_size + r`` at step ``k``. So after ``k`` steps the processes together have trained on
        exactly the batches, in the same order, that one process gets from ``k * world_size`` calls, and
        every epoch covers every pair once whatever ``world_size`` is. What is not the same: one
        optimizer step of DDP averages ``world_size`` batches (like gradient accumulation), and batches
        hold different numbers of target tokens, so weight per-rank losses by ``n_target_tokens`` to get
        the token mean.
        """
        _check_rank(rank, world_size)
        epoch, position = divmod(self.epoch * self.n_batches + self.position + rank, self.n_batches)
        batch = self._batch(self.batches[int(self._order(epoch)[position])])
        self.epoch, self.position = divmod(self.epoch * self.n_batches + self.position + world_size, self.n_batches)
        for old in [e for e in self._orders if e < self.epoch]:
            del self._orders[old], self._start_states[old]
        return batch

    def eval_batches(
        self, batch_size: int | None = None, *, max_tokens: int | None = None
    ) -> Iterator[TranslationBatch]:
        """Every pair exactly once, in length order, the same batches at every call; the generator is not used.

        Batches hold ``batch_size`` sentences and/or at most ``max_tokens`` padded tokens (by default this
        object's own sizes). Each batch's ``indices`` say which pairs it holds, so outputs decoded in
        length order can be put back in corpus order: ``outputs[batch.indices[j]] = decoded[j]``.
        """
        if batch_size is None and max_tokens is None:
            batch_size, max_tokens = self.batch_size, self.max_tokens
        _check_sizes(batch_size, max_tokens)
        for indices in self._chunk(self._length_order(), batch_size, max_tokens):
            yield self._batch(indices)

    def _length_order(self) -> list[int]:
        """All pair indices sorted by source length, then target length, then position (deterministic)."""
        return sorted(range(self.n_pairs), key=lambda i: (len(self.src[i]), len(self.tgt[i]), i))

    def _cost(self, i: int) -> int:
        """Padded tokens pair ``i`` needs per row: the longer of its source and its target plus bos/eos."""
        return max(len(self.src[i]), len(self.tgt[i]) + 1)

    def _chunk(self, order: list[int], batch_size: int | None, max_tokens: int | None) -> list[list[int]]:
        """Cut ``order`` into consecutive batches of at most ``batch_size`` rows and ``max_tokens`` tokens."""
        if max_tokens is not None:
            longest = max(order, key=self._cost)
            if self._cost(longest) > max_tokens:
                raise QkvError(
                    f"max_tokens is {max_tokens} but the longest pair needs {self._cost(longest)} tokens on its own: "
                    f"raise --max-tokens to at least {self._cost(longest)} or lower --max-len"
                )
        batches: list[list[int]] = []
        current: list[int] = []
        width = 0
        for i in order:
            new_width = max(width, self._cost(i))
            full = (batch_size is not None and len(current) >= batch_size) or (
                max_tokens is not None and new_width * (len(current) + 1) > max_tokens
            )
            if current and full:
                batches.append(current)
                current, new_width = [], self._cost(i)
            current.append(i)
            width = new_width
        batches.append(current)
        return batches

    def _order(self, epoch: int) -> torch.Tensor:
        """The shuffled order of the batches in ``epoch``; epochs' orders are drawn one after another."""
        while epoch not in self._orders:
            next_epoch = max(self._orders, default=self.epoch - 1) + 1
            self._start_states[next_epoch] = self.generator.get_state()
            self._orders[next_epoch] = torch.randperm(self.n_batches, generator=self.generator)
        return self._orders[epoch]

    def _batch(self, indices: list[int]) -> TranslationBatch:
        src = [self.src[i] for i in indices]
        tgt = [self.tgt[i] for i in indices]
        bos, eos = torch.tensor([self.bos_id]), torch.tensor([self.eos_id])
        src_padded = pad_sequence(src, batch_first=True, padding_value=self.pad_id)  # (B, S)
        tgt_in = pad_sequence([torch.cat([bos, t]) for t in tgt], batch_first=True, padding_value=self.pad_id)
        tgt_out = pad_sequence([torch.cat([t, eos]) for t in tgt], batch_first=True, padding_value=self.pad_id)
        src_lengths = torch.tensor([len(s) for s in src])
        tgt_lengths = torch.tensor([len(t) + 1 for t in tgt])
        return TranslationBatch(
            src=src_padded,
            src_padding_mask=torch.arange(src_padded.shape[1]) >= src_lengths[:, None],  # (B, S), True = padding
            tgt_in=tgt_in,  # (B, T)
            tgt_out=tgt_out,  # (B, T)
            tgt_padding_mask=torch.arange(tgt_in.shape[1]) >= tgt_lengths[:, None],  # (B, T)
            n_target_tokens=int(tgt_lengths.sum()),
            indices=torch.tensor(indices, dtype=torch.long),
        )

    # ------------------------------------------------------------------------------------ save / load

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """Where training stands (epoch, position) and the generator's state at the start of this epoch."""
        self._order(self.epoch)
        return {
            "generator": self._start_states[self.epoch].clone(),
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "n_pairs": self.n_pairs,
            "n_batches": self.n_batches,
        }

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        """Restore :meth:`state_dict` output: the following training batches are the ones the saved run
        would have drawn. The data and batch sizes must be the same as in the saved run."""
        saved = (state.get("n_pairs"), state.get("n_batches"))
        if saved != (self.n_pairs, self.n_batches):
            raise QkvError(
                f"the saved batch state is for {saved[0]} pairs in {saved[1]} batches, but this data has "
                f"{self.n_pairs} pairs in {self.n_batches} batches: resume with the same data, tokenizers, "
                "--batch-size/--max-tokens and --max-len"
            )
        generator_state = state.get("generator")
        if not isinstance(generator_state, torch.Tensor) or generator_state.dtype != torch.uint8:
            raise QkvError("the saved batch state has no generator state (a uint8 tensor): re-save the checkpoint")
        epoch, position = state.get("epoch"), state.get("position")
        if not isinstance(epoch, int) or not isinstance(position, int) or not 0 <= position < self.n_batches:
            raise QkvError("the saved batch state has no valid epoch and position: re-save the checkpoint")
        self.generator.set_state(generator_state.cpu())
        self.epoch, self.position = epoch, position
        self._orders.clear()
        self._start_states.clear()
        seed = state.get("seed")
        if isinstance(seed, int):
            self.seed = seed

    def __repr__(self) -> str:
        return (
            f"TranslationBatches(n_pairs={self.n_pairs}, n_batches={self.n_batches}, batch_size={self.batch_size}, "
            f"max_tokens={self.max_tokens}, max_len={self.max_len}, epoch={self.epoch}, seed={self.seed})"
        )


def _check_sizes(batch_size: int | None, max_tokens: int | None) -> None:
    if batch_size is None and max_tokens is None:
        raise QkvError("give batch_size (sentences per batch) or max_tokens (padded tokens per batch), or both")
    for name, value in (("batch_size", batch_size), ("max_tokens", max_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise QkvError(f"{name} must be a positive integer, got {value!r}: use e.g. 64 (or 4096 for max_tokens)")


def _check_rank(rank: int, world_size: int) -> None:
    for name, value, least in (("world_size", world_size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise QkvError(f"{name} must be an integer of at least {least}, got {value!r}: check the value")
    if rank >= world_size:
        raise QkvError(f"rank {rank} is not below world_size {world_size}: ranks run from 0 to world_size - 1")
