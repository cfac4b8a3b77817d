"""Encoder and decoder blocks: attention and feed-forward sublayers, each with a residual connection and
a norm (LayerNorm, or RMSNorm for the Llama family: :mod:`qkv.layers.norm`).

The notes on the mathematics of attention: "the residual layer is first added to the output ... before
normalizing", i.e. post-LN, as in the paper:
    x = LayerNorm(x + Sublayer(x))
GPT-2 moved the norm in front of the sublayer (pre-LN), which trains more stably in deep stacks:
    x = x + Sublayer(LayerNorm(x))
Both placements are here (``norm_first``); which norm, which feed-forward (plain or gated) and how many
key/value heads the attention has are the config's ``norm``, ``feed_forward`` and ``n_kv_heads``.

An encoder block has self-attention then the FFN; a decoder block has masked (causal) self-attention,
then cross-attention to the encoder output (queries from the decoder, keys and values from the encoder;
the encoder-decoder study notes), then the FFN. GPT's blocks are decoder blocks without cross-attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from torch import Tensor, nn

from qkv.layers.attention import MultiHeadAttention
from qkv.layers.capture import record
from qkv.layers.dropout import dropout_layer
from qkv.layers.feedforward import FeedForward, GatedFeedForward
from qkv.layers.kv_cache import LayerKVCache
from qkv.layers.norm import make_norm


class BlockConfig(Protocol):
    """The fields a block reads. Every model config (:mod:`qkv.models.config`) has them; layers never import
    the models, so any object with these attributes builds a block."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    activation: str
    norm_first: bool  # pre-LN (True) or post-LN (False)
    final_norm: bool  # a norm after the last block of a stack
    layer_norm_eps: float
    bias: bool
    norm: str  # "layernorm" or "rmsnorm"
    feed_forward: str  # "mlp" (FeedForward) or "glu" (GatedFeedForward)
    n_kv_heads: int  # key/value heads (n_heads unless attention is grouped)
    qkv_bias: bool  # biases on W_q, W_k, W_v (out_proj follows ``bias``)


class ResidualSublayer(nn.Module):
    """Residual connection plus a norm around one sublayer, before (pre-LN) or after (post-LN) it."""

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        self.norm = make_norm(config)
        self.dropout = dropout_layer(config.dropout)
        self.norm_first = config.norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """``out``, what the sublayer writes into the residual stream, is recorded (for the logit lens,
        direct logit attribution and patching, :mod:`qkv.inspect`)."""
        if self.norm_first:
            return x + record(self, "out", self.dropout(sublayer(self.norm(x))))
        return self.norm(x + record(self, "out", self.dropout(sublayer(x))))


def _attention(config: BlockConfig, window: int | None = None) -> MultiHeadAttention:
    return MultiHeadAttention(
        config.d_model,
        config.n_heads,
        n_kv_heads=config.n_kv_heads,
        dropout=config.attention_dropout,
        bias=config.bias,
        qkv_bias=config.qkv_bias,
        window=window,
    )


def _feed_forward(config: BlockConfig) -> FeedForward | GatedFeedForward:
    kind = GatedFeedForward if config.feed_forward == "glu" else FeedForward
    return kind(
        config.d_model, config.d_ff, activation=config.activation, dropout=config.activation_dropout, bias=config.bias
    )


class Part(NamedTuple):
    """One sublayer of a block, by attribute name: ``kind`` ("attn", "cross" or "mlp"), the ResidualSublayer around
    it (``residual``: its norm and residual connection), and what that wraps (``inner``: an attention or the FFN)."""

    kind: str
    residual: str
    inner: str


def block_parts(block: nn.Module) -> list[tuple[Part, ResidualSublayer, Any]]:
    """The sublayers ``block`` has, in order (a decoder block without cross-attention has two; a block of another
    kind none): each part, its ResidualSublayer, and what that wraps."""
    parts: tuple[Part, ...] = getattr(type(block), "parts", ())
    found = ((part, getattr(block, part.residual, None), getattr(block, part.inner, None)) for part in parts)
    return [(part, around, inner) for part, around, inner in found if around is not None and inner is not None]


class EncoderBlock(nn.Module):
    """Self-attention over all positions, then the token-wise FFN."""

    parts = (Part("attn", "attn_sublayer", "self_attn"), Part("mlp", "ffn_sublayer", "feed_forward"))

    def __init__(self, config: BlockConfig) -> None:
        super().__init__()
        self.self_attn = _attention(config)
        self.attn_sublayer = ResidualSublayer(config)
        self.feed_forward = _feed_forward(config)
        self.ffn_sublayer = ResidualSublayer(config)

    def forward(
        self,
        x: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        x = self.attn_sublayer(
            x,
            lambda h: self.self_attn(h, key_padding_mask=key_padding_mask, attn_mask=attn_mask, rotary=rotary)[0],
        )
        x = self.ffn_sublayer(x, self.feed_forward)
        return record(self, "output", x)


class DecoderBlock(nn.Module):
    """Masked self-attention, cross-attention to the encoder output (optional), then the FFN. ``window``: the
    self-attention sees only the last ``window`` positions (a causal sliding window, as Mistral's)."""

    parts = (
        Part("attn", "self_attn_sublayer", "self_attn"),
        Part("cross", "cross_attn_sublayer", "cross_attn"),
        Part("mlp", "ffn_sublayer", "feed_forward"),
    )

    def __init__(self, config: BlockConfig, *, cross_attention: bool = True, window: int | None = None) -> None:
        super().__init__()
        self.self_attn = _attention(config, window)
        self.self_attn_sublayer = ResidualSublayer(config)
        self.cross_attn = _attention(config) if cross_attention else None
        self.cross_attn_sublayer = ResidualSublayer(config) if cross_attention else None
        self.feed_forward = _feed_forward(config)
        self.ffn_sublayer = ResidualSublayer(config)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        cache: tuple[LayerKVCache, LayerKVCache | None] | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        self_cache, cross_cache = cache if cache is not None else (None, None)
        x = self.self_attn_sublayer(
            x,
            lambda h: self.self_attn(
                h, causal=True, key_padding_mask=key_padding_mask, cache=self_cache, rotary=rotary
            )[0],
        )
        if self.cross_attn is not None and self.cross_attn_sublayer is not None:  # made together
            if memory is None:
                raise ValueError("a decoder block with cross-attention needs the encoder output (memory)")
            x = self.cross_attn_sublayer(
                x,
                lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache)[0],
            )
        x = self.ffn_sublayer(x, self.feed_forward)
        return record(self, "output", x)
