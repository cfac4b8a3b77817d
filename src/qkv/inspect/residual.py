"""The residual stream: where a model keeps it (capture's names) and how the model reads it out.

Every block adds what its sublayers compute to a running sum of vectors, one per token, the residual
stream (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"):

    x_0 = W_E[token] + positions                       "embedding.output"
    x_{i+1} = x_i + attn_i(x_i) + mlp_i(x_i + attn_i)   "decoder.blocks.{i}.output" (pre-LN)
    logits = LayerNorm_final(x_N) W_U (+ b)             the model's own final norm and unembedding

In a post-LN model (the paper, BERT, Marian) every block ends with a LayerNorm, x_{i+1} = LN(LN(x_i +
attn) + mlp), so the stream is renormalised after each block and there is usually no final norm. Either
way the model reads its last block's output with ``read_out`` = final norm (or nothing) then W_U; the logit
lens reads every earlier block's output the same way.

:class:`Stream` names the pieces of one model's stream (built from its family's ``streams``, names from
:func:`~qkv.inspect.names.act_name`) for :func:`qkv.layers.capture.capture` and
:func:`~qkv.layers.capture.intervene`; the logit lens, direct logit attribution and activation patching
all read it from there, so none of them runs a second forward implementation.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.inspect.names import act_name, block_name
from qkv.layers.blocks import DecoderBlock, EncoderBlock, Part
from qkv.models.family import TRANSLATOR, family_of

if TYPE_CHECKING:
    from qkv.models.config import BaseConfig
    from qkv.models.rnnsearch import RNNSearch
    from qkv.models.transformer import Transformer


@dataclass(frozen=True)
class Sublayer:
    """One thing a block adds to the stream: attention ("attn", "cross") or the feed-forward net ("mlp")."""

    kind: str  # "attn", "cross" or "mlp"
    residual: str  # the ResidualSublayer's name within a block, e.g. "self_attn_sublayer"
    attention: str | None  # the MultiHeadAttention's name within a block, e.g. "self_attn"; None for "mlp"


def _sublayers(parts: tuple[Part, ...], cross: bool = False) -> tuple[Sublayer, ...]:
    """A block class's parts (:attr:`qkv.layers.blocks.DecoderBlock.parts`) as the stream's sublayers."""
    return tuple(
        Sublayer(part.kind, part.residual, None if part.kind == "mlp" else part.inner)
        for part in parts
        if cross or part.kind != "cross"
    )


GPT_SUBLAYERS = _sublayers(DecoderBlock.parts)
TRANSLATOR_SUBLAYERS = _sublayers(DecoderBlock.parts, cross=True)
ENCODER_SUBLAYERS = _sublayers(EncoderBlock.parts)


@dataclass(frozen=True)
class Stream:
    """One residual stream of a model, by capture name: the decoder of a GPT or translator, or an encoder."""

    name: str  # "decoder" or "encoder"
    embedding: str  # the InputEmbedding module: "embedding", "tgt_embedding" or "src_embedding"
    stack: str  # "decoder" or "encoder": the blocks are "{stack}.blocks.{i}"
    n_layers: int
    n_heads: int
    sublayers: tuple[Sublayer, ...]
    norm_first: bool  # pre-LN: the stream is a plain sum of what every sublayer wrote

    def block(self, layer: int) -> str:
        return block_name(layer, self.stack)

    def resid(self, row: int) -> str:
        """The stream after ``row`` blocks: row 0 is the embedding's output, row i the output of block i - 1."""
        return act_name("resid_pre", row, stack=self.stack, embedding=self.embedding)

    def embedding_act(self, what: str) -> str:
        """The embedding's "tokens", "positions" or "embed" (their sum, x_0)."""
        return act_name(what, embedding=self.embedding)

    def attention_act(self, layer: int, sublayer: Sublayer, what: str) -> str:
        """``what`` ("q", "k", "v", "weights", "context") of ``sublayer``'s attention in block ``layer``."""
        assert sublayer.attention is not None
        return act_name(what, layer, stack=self.stack, attention=sublayer.attention)

    @property
    def rows(self) -> list[str]:
        """Labels of the n_layers + 1 places the stream can be read: "embedding", "block 0", ..."""
        return ["embedding"] + [f"block {i}" for i in range(self.n_layers)]

    def sublayer_out(self, layer: int, sublayer: Sublayer) -> str:
        return act_name("sublayer_out", layer, stack=self.stack, sublayer=sublayer.residual)


def stream(model: nn.Module, part: str) -> Stream:
    """The residual stream of ``part`` ("encoder" or "decoder"), as the model's family describes it."""
    family = family_of(model)
    embedding, stack = family.streams[part]
    config = cast("BaseConfig", model.config)  # a model with a residual stream is a Transformer's kind
    if part in family.masked:  # a decoder block, with cross-attention in the middle when it reads an encoder
        sublayers = TRANSLATOR_SUBLAYERS if family.has("cross-attention") else GPT_SUBLAYERS
    else:  # an encoder block: self-attention, then the feed-forward net
        sublayers = ENCODER_SUBLAYERS
    n_layers = len(cast(nn.ModuleList, model.get_submodule(stack).blocks))
    return Stream(part, embedding, stack, n_layers, config.n_heads, sublayers, config.norm_first)


def output_stream(model: nn.Module, *, what: str) -> Stream:
    """The stream that ends in W_U (a language model's, or a translator's decoder); ``what`` (e.g. "the logit
    lens") is refused with the family's one line when the model has no residual stream or no W_U."""
    family = family_of(model)
    family.require("residual stream", what)
    family.require("unembedding", what)
    assert family.output is not None
    return stream(model, family.output)


def streams(model: nn.Module, *, what: str) -> list[Stream]:
    """Every residual stream of the model in the order they run (a translator: encoder, then decoder); the
    model must have W_U (``what`` is refused otherwise, as in :func:`output_stream`)."""
    output_stream(model, what=what)
    return [stream(model, part) for part in family_of(model).streams]


def final_norm(model: nn.Module) -> nn.Module:
    """The norm between the last block and W_U: a LayerNorm or RMSNorm (pre-LN models) or nn.Identity (post-LN)."""
    family = family_of(model)
    assert family.output is not None
    return cast(nn.Module, model.get_submodule(family.streams[family.output][1]).final_norm)


@torch.no_grad()
def read_out(model: nn.Module, resid: Tensor) -> Tensor:
    """logits = W_U final_norm(resid) (+ b): what the model does to its last block's output. (..., vocab)"""
    unembedding = cast(nn.Module, model.unembedding)
    return unembedding(final_norm(model)(resid))


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def run_model(model: nn.Module, source: Tensor, target: Tensor | None = None, *, last_only: bool = False) -> Tensor:
    """The model's output for token ids (B, T): a GPT's logits (B, T, vocab) on ``source``, a translator's on
    ``source`` (encoder) and ``target`` (decoder, teacher-forced), an encoder's vectors. ``last_only``: W_U reads
    the last position only, (B, 1, vocab), when the model has one (the views that score one position or none)."""
    family = family_of(model)
    last_only = last_only and family.has("unembedding")
    if family.role == TRANSLATOR:
        assert target is not None
        if last_only:
            translator = cast("Transformer | RNNSearch", model)
            return translator.decode(target, translator.encode(source), last_only=True)
        return model(source, target)
    return model(source, last_only=True) if last_only else model(source)


@contextmanager
def resume_at(model: nn.Module, stream: Stream, row: int) -> Iterator[None]:
    """Run ``stream``'s blocks from block ``row`` on: the earlier blocks are left out of every forward pass
    inside, so the stream's embedding output must be replaced (by an :func:`~qkv.layers.capture.intervene`
    edit entered *before* this block, which names the modules) with the stream as it stands after ``row``
    blocks. Activation patching uses it: a site in block ``row`` leaves blocks 0..row-1 unchanged, so
    recomputing them is waste (half of every run on average). Nothing else may run the model meanwhile."""
    stack = model.get_submodule(stream.stack)
    blocks = cast(nn.ModuleList, stack.blocks)
    stack.blocks = nn.ModuleList(list(blocks)[row:])  # the modules keep the names capture gave them
    try:
        yield
    finally:
        stack.blocks = blocks
