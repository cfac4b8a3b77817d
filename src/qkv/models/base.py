"""What every qkv model shares: its config, rotary angles when it uses RoPE, the length check and the
parameter count. GPT, the encoder and the encoder-decoder each add their own embeddings and stacks;
RNNSearch its recurrent encoder and decoder. The two translators share :class:`EncoderDecoder`'s
teacher-forced forward: encode the source once, decode the target against it.

Every model has ``config.context_length`` positions: the longest sequence (a GPT's context, an encoder's
input, a translator's source or target sentence) it can attend over.
"""

from __future__ import annotations

from typing import Protocol, cast

from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.layers.positional import RotaryEmbedding
from qkv.models.config import BaseConfig, ModelConfig


class PositionedConfig(Protocol):
    """What every model's config has, whatever its family (a Transformer's or RNNSearch's): its positions."""

    context_length: int


class Model(nn.Module):
    """A model built from ``config``; ``rotary`` holds RoPE's cos/sin tables if it uses them."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        rope = cast(BaseConfig, config)  # a config that rotates is a Transformer's (RNNSearch has no positions)
        self.rotary = (
            RotaryEmbedding(rope.context_length, rope.head_dim, base=rope.rope_base, scaling=rope.rope_scaling)
            if config.rotary()
            else None
        )

    def rotary_angles(self, length: int, start: int = 0) -> tuple[Tensor, Tensor] | None:
        """(cos, sin) for positions start..start+length-1, or None when the model adds positions instead."""
        return self.rotary(length, start) if self.rotary is not None else None

    def check_length(self, length: int, what: str = "input", fix: str = "shorten it") -> None:
        """QkvError when ``length`` positions do not fit the model's ``context_length``."""
        context_length = cast(PositionedConfig, self.config).context_length
        if length > context_length:
            raise QkvError(
                f"{length} {what} tokens do not fit the model's context of {context_length} positions: {fix}"
            )

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters())


class EncoderDecoder(Model):
    """A translator: ``encode(src_ids)`` gives the source's vectors ("memory", once per sentence) and
    ``decode(tgt_ids, memory)`` the next-token logits of the target; the two are defined by the subclass."""

    def encode(self, src_ids: Tensor, *, src_padding_mask: Tensor | None = None) -> Tensor:
        """The source's vectors (B, S, d) for source ids (B, S): the subclass's encoder."""
        raise NotImplementedError

    def decode(
        self,
        tgt_ids: Tensor,
        memory: Tensor,
        *,
        memory_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits (B, T, tgt_vocab_size) for target ids (B, T) given ``memory``: the subclass's decoder."""
        raise NotImplementedError

    def forward(
        self,
        src_ids: Tensor,
        tgt_ids: Tensor,
        *,
        src_padding_mask: Tensor | None = None,
        tgt_padding_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher-forced logits (B, T, tgt_vocab_size): encode the source, decode the given target."""
        memory = self.encode(src_ids, src_padding_mask=src_padding_mask)
        return self.decode(tgt_ids, memory, memory_padding_mask=src_padding_mask, tgt_padding_mask=tgt_padding_mask)
