"""Batches for training a language model: windows of token ids and the same windows shifted by one.

A language model learns to predict token t+1 from tokens 0..t. So the whole corpus becomes one long row
of token ids (text ─▶ tokenizer ─▶ ids), and a training example is any window of ``context_length + 1``
consecutive ids: the first ``context_length`` are the input ``x``, the last ``context_length`` are the
targets ``y``. ``y[t]`` is the token that follows ``x[:t+1]``, and a causal model predicts all of them at
once::

    ids:  The  quick  brown  fox  jumps          (context_length = 4)
    x:    The  quick  brown  fox
    y:    quick  brown  fox  jumps

The first 90% of the ids are for training and the last 10% for validation (the nanoGPT convention), so
the validation text is text the model never trained on. Window starts are drawn at random from a
:class:`torch.Generator` the object owns, whose state goes into checkpoints for an exact resume.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import torch

from qkv.data.pieces import cut_text
from qkv.data.shards import TokenShards
from qkv.errors import QkvError
from qkv.tokenizers import BPETokenizer, CharTokenizer, Tokenizer, WordTokenizer

EVAL_SEED = 1234
"""Seed of the fresh generator behind every :meth:`TokenBatches.eval_batches` call: each evaluation, in
every run whatever its training seed, sees the same windows, so losses are comparable."""

CHUNK_CHARS = 1 << 18
"""Texts are encoded in pieces of about this many characters (see :func:`encode_corpus`)."""

_CHUNK_SAFE = (CharTokenizer, WordTokenizer, BPETokenizer)  # no token of theirs spans a qkv.data.pieces cut

Split = Literal["train", "val"]


def encode_corpus(text: str, tokenizer: Tokenizer, *, chunk_chars: int = CHUNK_CHARS) -> torch.Tensor:
    """``torch.tensor(tokenizer.encode(text))`` as a 1-D long tensor, computed faster for long texts.

    For qkv's char, word and BPE tokenizers the text is cut into pieces of about ``chunk_chars`` characters
    where no token can span the cut (before whitespace that follows a non-space character: see
    :mod:`qkv.data.pieces`), and the pieces go through ``encode_batch`` (in parallel for BPE), so the result
    equals one ``encode`` of the whole text. Other tokenizers (pretrained ``tokenizer.json`` files, whose
    pre-tokenizers may treat the start of a text specially) get one ``encode`` call.
    """
    if type(tokenizer) not in _CHUNK_SAFE or len(text) <= chunk_chars:
        return torch.from_numpy(tokenizer.encode_array(text))
    encoded = tokenizer.encode_batch(cut_text(text, chunk_chars))
    return torch.cat([torch.tensor(ids, dtype=torch.long) for ids in encoded])


class TokenBatches:
    """Random training windows and fixed validation windows over one corpus of token ids.

    ``ids`` is the whole corpus: a 1-D integer tensor (or a list of ints), or the memory-mapped shards of a
    prepared folder (:class:`~qkv.data.shards.TokenShards`), whose windows are read from the map batch by
    batch. The first ``int(len(ids) * (1 - val_fraction))`` ids form the training split, the rest the
    validation split; each split must hold at least one window of ``context_length + 1`` ids.
    ``val_fraction=0`` turns validation off: :attr:`has_validation` is then False and asking for
    validation batches is a QkvError.

    Attributes: ``ids`` (the tensor or the shards), ``context_length``, ``val_fraction``, ``seed``, and
    ``generator``, the :class:`torch.Generator` (seeded with ``seed``) that draws training windows.
    Batches are CPU int64 tensors: move them with ``.to(device)``.
    """

    def __init__(
        self,
        ids: torch.Tensor | Sequence[int] | TokenShards,
        context_length: int,
        *,
        val_fraction: float = 0.1,
        seed: int = 0,
    ) -> None:
        if not isinstance(ids, TokenShards):
            ids = torch.as_tensor(ids)
            if ids.ndim != 1 or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
                raise QkvError(
                    f"token ids must be a 1-D integer tensor, got {ids.dtype} of shape {tuple(ids.shape)}: "
                    "pass tokenizer.encode(text) or use TokenBatches.from_text"
                )
            ids = ids.to(torch.long).cpu()
        if isinstance(context_length, bool) or not isinstance(context_length, int) or context_length < 1:
            raise QkvError(f"context_length must be a positive integer, got {context_length!r}: use e.g. 256")
        if not 0.0 <= val_fraction < 1.0:
            raise QkvError(
                f"val_fraction must be at least 0 and below 1, got {val_fraction!r}: use e.g. 0.1 "
                "(or 0 for no validation)"
            )
        self.ids = ids
        self.context_length = context_length
        self.val_fraction = float(val_fraction)
        self.seed = seed
        n = len(self.ids)
        self._n_train = int(n * (1.0 - self.val_fraction))  # nanoGPT: train = data[:int(n * 0.9)]
        self._n_val = n - self._n_train
        window = context_length + 1
        too_short = [("training", self._n_train, "a smaller --val-fraction")]
        if self.val_fraction > 0:
            too_short.append(("validation", self._n_val, "a larger --val-fraction (0 turns validation off)"))
        for split, size, fix in too_short:
            if size < window:
                raise QkvError(
                    f"the corpus has {n} tokens: the {split} split ({size} tokens) is shorter than one "
                    f"context window of context_length + 1 = {window} tokens: use a longer text, a smaller "
                    f"--context-length, or {fix}"
                )
        self._offsets = torch.arange(window)  # (T+1,)
        self.generator = torch.Generator().manual_seed(seed)

    @classmethod
    def from_text(
        cls,
        text: str,
        tokenizer: Tokenizer,
        context_length: int,
        *,
        val_fraction: float = 0.1,
        seed: int = 0,
    ) -> TokenBatches:
        """Encode ``text`` with ``tokenizer`` (see :func:`encode_corpus`) and batch the ids."""
        return cls(encode_corpus(text, tokenizer), context_length, val_fraction=val_fraction, seed=seed)

    # ------------------------------------------------------------------------------------------ sizes

    @property
    def n_train_tokens(self) -> int:
        return self._n_train

    @property
    def n_val_tokens(self) -> int:
        return self._n_val

    @property
    def train_ids(self) -> torch.Tensor:
        """The training split as a tensor (a view of an in-memory corpus; a copy when read from shards)."""
        return self.ids[: self._n_train]

    @property
    def val_ids(self) -> torch.Tensor:
        """The validation split as a tensor (a view of an in-memory corpus; a copy when read from shards)."""
        return self.ids[self._n_train :]

    @property
    def has_validation(self) -> bool:
        """False when ``val_fraction`` is 0."""
        return self.n_val_tokens > 0

    # ---------------------------------------------------------------------------------------- batches

    def train_batch(self, batch_size: int, *, rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """One random batch ``(x, y)`` from the training split, each ``(batch_size, context_length)``.

        ``y`` is ``x`` shifted by one token: ``y[:, t]`` is the token after ``x[:, t]``. The generator
        draws ``batch_size * world_size`` window starts and this process keeps rows
        ``rank * batch_size`` up to ``(rank + 1) * batch_size``, so ``world_size`` processes with the same
        seed see together exactly the batch that one process with ``batch_size * world_size`` sees, and
        their generators stay in step.
        """
        rows = _rows(batch_size, rank, world_size)
        starts = torch.randint(
            self.n_train_tokens - self.context_length, (batch_size * world_size,), generator=self.generator
        )
        return self._windows(0, starts[rows])

    def eval_batches(
        self, split: Split, n_batches: int, batch_size: int, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``n_batches`` batches ``(x, y)`` from ``split`` ("train" or "val"), the same ones at every call.

        The windows come from a fresh generator seeded with :data:`EVAL_SEED`, never from
        :attr:`generator`, so evaluating does not change the training batches that follow. ``rank`` and
        ``world_size`` split each batch between processes as in :meth:`train_batch`.
        """
        if split not in ("train", "val"):
            raise QkvError(f"split must be 'train' or 'val', got {split!r}: choose one of them")
        if split == "val" and not self.has_validation:
            raise QkvError(
                "there is no validation split (val_fraction is 0): set --val-fraction above 0, e.g. 0.1, "
                "or evaluate on the training split"
            )
        if isinstance(n_batches, bool) or not isinstance(n_batches, int) or n_batches < 0:
            raise QkvError(f"n_batches must be a whole number of batches, got {n_batches!r}: use e.g. 20")
        rows = _rows(batch_size, rank, world_size)
        first, size = (0, self._n_train) if split == "train" else (self._n_train, self._n_val)
        return self._eval_iter(first, size, n_batches, batch_size * world_size, rows)

    def val_batches(
        self, n_batches: int, batch_size: int, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``eval_batches("val", ...)``: the same validation windows at every call."""
        return self.eval_batches("val", n_batches, batch_size, rank=rank, world_size=world_size)

    def fixed_train_batches(
        self, n_batches: int, batch_size: int, *, rank: int = 0, world_size: int = 1
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``eval_batches("train", ...)``: fixed training windows, e.g. to evaluate when ``val_fraction`` is 0."""
        return self.eval_batches("train", n_batches, batch_size, rank=rank, world_size=world_size)

    def _eval_iter(
        self, first: int, size: int, n_batches: int, total: int, rows: slice
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(EVAL_SEED)
        for _ in range(n_batches):
            starts = torch.randint(size - self.context_length, (total,), generator=generator)
            yield self._windows(first, starts[rows])

    def _windows(self, first: int, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The windows ``ids[first + s : first + s + T + 1]`` for every start ``s``: one indexing operation
        on a tensor, or one read per window from the memory-mapped shards."""
        if isinstance(self.ids, TokenShards):
            windows = self.ids.windows(starts + first, len(self._offsets))  # (B, T+1)
        else:
            windows = self.ids[(starts + first)[:, None] + self._offsets]  # (B, T+1)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()  # x, y: (B, T) each

    # ------------------------------------------------------------------------------------ save / load

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """The training generator's state, with the sizes it belongs to; put it in a checkpoint."""
        return {
            "generator": self.generator.get_state(),
            "seed": self.seed,
            "context_length": self.context_length,
            "n_train_tokens": self.n_train_tokens,
        }

    def load_state_dict(self, state: dict[str, torch.Tensor | int]) -> None:
        """Restore :meth:`state_dict` output: the following training batches are the ones the saved run
        would have drawn. The data must have the same training split size and context length."""
        saved = (state.get("n_train_tokens"), state.get("context_length"))
        if saved != (self.n_train_tokens, self.context_length):
            raise QkvError(
                f"the saved batch state is for {saved[0]} training tokens and context_length {saved[1]}, "
                f"but this data has {self.n_train_tokens} and {self.context_length}: resume with the same "
                "--data, --val-fraction, tokenizer and --context-length"
            )
        generator_state = state.get("generator")
        if not isinstance(generator_state, torch.Tensor) or generator_state.dtype != torch.uint8:
            raise QkvError("the saved batch state has no generator state (a uint8 tensor): re-save the checkpoint")
        self.generator.set_state(generator_state.cpu())
        seed = state.get("seed")
        if isinstance(seed, int):
            self.seed = seed

    def __repr__(self) -> str:
        return (
            f"TokenBatches(n_train_tokens={self.n_train_tokens}, n_val_tokens={self.n_val_tokens}, "
            f"context_length={self.context_length}, seed={self.seed})"
        )


def _rows(batch_size: int, rank: int, world_size: int) -> slice:
    """The rows of a batch of ``batch_size * world_size`` that belong to process ``rank``."""
    for name, value, least in (("batch_size", batch_size, 1), ("world_size", world_size, 1), ("rank", rank, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise QkvError(f"{name} must be an integer of at least {least}, got {value!r}: check the value")
    if rank >= world_size:
        raise QkvError(f"rank {rank} is not below world_size {world_size}: ranks run from 0 to world_size - 1")
    return slice(rank * batch_size, (rank + 1) * batch_size)
