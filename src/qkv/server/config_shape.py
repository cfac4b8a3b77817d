"""What the server reads of a served model's config, as Protocols: the Transformers' fields (d_model, h, N).

A served model is a Transformer (GPT, Llama, the encoder-decoder) or RNNSearch, whose config answers the same
names with properties (one head, one layer per stack, d_model = its GRU width). :class:`~qkv.models.config.
ModelConfig` declares none of them, so the server states what it relies on here.
"""

from __future__ import annotations

from typing import Protocol


class ServedConfig(Protocol):
    """Every served model's shape: its width d_model, its h heads, the longest text it attends over."""

    @property
    def context_length(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def d_model(self) -> int: ...


class DecoderConfig(ServedConfig, Protocol):
    """A language model's (or an encoder's) one stack of N layers."""

    @property
    def n_layers(self) -> int: ...


class TranslatorConfig(ServedConfig, Protocol):
    """A translator's two stacks: the encoder's layers and the decoder's."""

    @property
    def n_encoder_layers(self) -> int: ...

    @property
    def n_decoder_layers(self) -> int: ...
