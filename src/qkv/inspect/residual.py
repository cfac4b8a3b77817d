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

:class:`Stream` names the pieces of one model's stream for :func:`qkv.layers.capture.capture` and
:func:`~qkv.layers.capture.intervene`; the logit lens, direct logit attribution and activation patching
all read it from there, so none of them runs a second forward implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from qkv.errors import QkvError


@dataclass(frozen=True)
class Sublayer:
    """One thing a block adds to the stream: attention ("attn", "cross") or the feed-forward net ("mlp")."""

    kind: str  # "attn", "cross" or "mlp"
    residual: str  # the ResidualSublayer's name within a block, e.g. "self_attn_sublayer"
    attention: str | None  # the MultiHeadAttention's name within a block, e.g. "self_attn"; None for "mlp"


GPT_SUBLAYERS = (
    Sublayer("attn", "self_attn_sublayer", "self_attn"),
    Sublayer("mlp", "ffn_sublayer", None),
)
TRANSLATOR_SUBLAYERS = (
    Sublayer("attn", "self_attn_sublayer", "self_attn"),
    Sublayer("cross", "cross_attn_sublayer", "cross_attn"),
    Sublayer("mlp", "ffn_sublayer", None),
)
ENCODER_SUBLAYERS = (
    Sublayer("attn", "attn_sublayer", "self_attn"),
    Sublayer("mlp", "ffn_sublayer", None),
)


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
        return f"{self.stack}.blocks.{layer}"

    def resid(self, row: int) -> str:
        """The stream after ``row`` blocks: row 0 is the embedding's output, row i the output of block i - 1."""
        return f"{self.embedding}.output" if row == 0 else f"{self.block(row - 1)}.output"

    @property
    def rows(self) -> list[str]:
        """Labels of the n_layers + 1 places the stream can be read: "embedding", "block 0", ..."""
        return ["embedding"] + [f"block {i}" for i in range(self.n_layers)]

    def sublayer_out(self, layer: int, sublayer: Sublayer) -> str:
        return f"{self.block(layer)}.{sublayer.residual}.out"


def model_kind(model: nn.Module) -> str:
    return model.config.kind  # type: ignore[union-attr]


def decoder_stream(model: nn.Module, *, what: str) -> Stream:
    """The stream that ends in W_U (a GPT's, or a translator's decoder); QkvError for an encoder.

    ``what`` names the analysis for the message (e.g. "the logit lens").
    """
    config = model.config  # type: ignore[union-attr]
    if config.kind == "gpt":
        return Stream("decoder", "embedding", "decoder", config.n_layers, config.n_heads, GPT_SUBLAYERS,
                      config.norm_first)  # fmt: skip
    if config.kind == "transformer":
        return Stream("decoder", "tgt_embedding", "decoder", config.n_decoder_layers, config.n_heads,
                      TRANSLATOR_SUBLAYERS, config.norm_first)  # fmt: skip
    refuse_non_transformer(config.kind, what)
    raise QkvError(
        f"{what} reads the stream through the unembedding W_U, and an encoder has none (qkv imports BERT "
        "without its masked-LM head): use a GPT or a translator, or `qkv heads` for an encoder"
    )


def refuse_non_transformer(kind: str, what: str, needs: str = "a Transformer's residual stream") -> None:
    """QkvError for the models that have no ``needs`` (RNNSearch's GRUs, Word2Vec); else nothing."""
    if kind == "rnnsearch":
        raise QkvError(
            f"{what} reads {needs}, and RNNSearch has none (GRUs and one additive alignment): use "
            "`qkv attention` for its alignment or `qkv next` for its predictions, or a Transformer translator"
        )
    if kind == "word2vec":
        raise QkvError(f"{what} needs a Transformer; Word2Vec is one matrix of word vectors: use `qkv embeddings`")


def encoder_stream(model: nn.Module) -> Stream:
    """A translator's encoder stream (the source side), which its decoder reads through cross-attention."""
    config = model.config  # type: ignore[union-attr]
    refuse_non_transformer(config.kind, "this view")
    if config.kind != "transformer":
        raise QkvError(f"a {config.kind} model has no encoder that feeds a decoder: use a translator")
    return Stream("encoder", "src_embedding", "encoder", config.n_encoder_layers, config.n_heads,
                  ENCODER_SUBLAYERS, config.norm_first)  # fmt: skip


def final_norm(model: nn.Module) -> nn.Module:
    """The norm between the last block and W_U: a LayerNorm (pre-LN models) or nn.Identity (post-LN)."""
    return model.decoder.final_norm  # type: ignore[union-attr, return-value]


@torch.no_grad()
def read_out(model: nn.Module, resid: Tensor) -> Tensor:
    """logits = W_U final_norm(resid) (+ b): what the model does to its last block's output. (..., vocab)"""
    return model.unembedding(final_norm(model)(resid))  # type: ignore[union-attr, operator]


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def run_model(model: nn.Module, source: Tensor, target: Tensor | None = None) -> Tensor:
    """The model's logits (B, T, vocab) for token ids (B, T): a GPT on ``source``, a translator on ``source``
    (encoder) and ``target`` (decoder, teacher-forced)."""
    if model_kind(model) == "transformer":
        assert target is not None
        return model(source, target)
    return model(source)
