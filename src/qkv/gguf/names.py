"""One row of a GGUF architecture's name table, and the few ways a tensor changes between GGUF and qkv.

Each family's GGUF module (:mod:`qkv.models.llama.gguf`, :mod:`qkv.models.gpt.gguf`) lists
:class:`Row` s ``(GGUF name, qkv name(s), to qkv, to GGUF)``, read in both directions: loading applies
``to_qkv`` to each GGUF tensor, writing applies ``to_gguf`` to the qkv tensors. ``{i}`` in a name stands for
the block number. GGUF's names are llama.cpp's (gguf-py's constants.py, ``MODEL_TENSOR``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

BLOCK = "decoder.blocks.{i}"
W_E = "embedding.token_embedding.weight"
W_U = "unembedding.weight"
W_POS = "embedding.positional_encoding.weight"


def same(t: Tensor) -> tuple[Tensor, ...]:
    """The tensor as it is."""
    return (t,)


def first(*tensors: Tensor) -> Tensor:
    """The one qkv tensor as it is."""
    return tensors[0]


@dataclass(frozen=True)
class Row:
    """GGUF tensor ``gguf`` <-> qkv tensors ``qkv`` (several when GGUF fuses them, as GPT-2's attn_qkv)."""

    gguf: str
    qkv: tuple[str, ...]
    to_qkv: Callable[[Tensor], tuple[Tensor, ...]] = same
    to_gguf: Callable[..., Tensor] = first

    @property
    def plain(self) -> bool:
        """True when the tensor is copied as it is (it can be dequantized straight into the parameter)."""
        return self.to_qkv is same

    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.gguf).replace(r"\{i\}", r"(?P<i>\d+)"))


def row(gguf: str, *qkv: str, to_qkv: Callable[[Tensor], tuple[Tensor, ...]] = same,
        to_gguf: Callable[..., Tensor] = first) -> Row:  # fmt: skip
    """A :class:`Row`: ``row("blk.{i}.attn_v.weight", BLOCK + ".self_attn.value.weight")``."""
    return Row(gguf, tuple(qkv), to_qkv, to_gguf)


def fill(template: str, block: str | int | None) -> str:
    """``template`` with ``{i}`` replaced by the block number."""
    return template.replace("{i}", str(block)) if block is not None else template


# ------------------------------------------------------------------------------------------ transforms


def rope_unpermute(n_heads: int) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """Undo llama.cpp's row order of W_q / W_k (n_heads * d_k, d_model) for ``llama`` models.

    llama.cpp rotates adjacent pairs (x_2j, x_2j+1) ("normal" RoPE); Hugging Face and qkv rotate (x_j,
    x_j+d/2) ("rotate half"). convert_hf_to_gguf.py reorders the rows of each head from [first half; second
    half] to interleaved pairs, so that the two rotations agree; this puts them back."""

    def unpermute(t: Tensor) -> tuple[Tensor, ...]:
        rows = t.shape[0]
        return (t.reshape(n_heads, rows // n_heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape),)

    return unpermute


def rope_permute(n_heads: int) -> Callable[..., Tensor]:
    """qkv's W_q / W_k rows in llama.cpp's order (the inverse of :func:`rope_unpermute`)."""

    def permute(t: Tensor) -> Tensor:
        rows = t.shape[0]
        return t.reshape(n_heads, 2, rows // n_heads // 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)

    return permute


def split_rows(*sizes: int) -> Callable[[Tensor], tuple[Tensor, ...]]:
    """A fused tensor [A; B; C] (rows stacked) -> (A, B, C) with ``sizes`` rows each (GPT-2's attn_qkv)."""

    def split(t: Tensor) -> tuple[Tensor, ...]:
        if t.shape[0] != sum(sizes):
            raise ValueError(f"expected {sum(sizes)} rows, found {t.shape[0]}")
        return tuple(part.contiguous() for part in t.split(list(sizes)))

    return split


def cat_rows(*tensors: Tensor) -> Tensor:
    """(A, B, C) -> [A; B; C]: the inverse of :func:`split_rows`."""
    return torch.cat(tensors)
