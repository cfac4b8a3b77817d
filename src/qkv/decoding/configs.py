"""The config a decoding road reads, by the kind of model it decodes.

A model's ``config`` is declared on :class:`qkv.models.base.Model` as the base :class:`ModelConfig`, and a model
handed around as an ``nn.Module`` shows the type checker ``Tensor | Module`` for every attribute. The decoding
loops know more: a decoder-only model (GPT, Llama) carries a :class:`GPTConfig` (context_length, vocab_size, the
heads its KV cache holds), a translator (the encoder-decoder Transformer, RNNSearch) a config with a source and a
target vocabulary. These two functions say so, once, where a loop first reads the config; nothing is checked or
copied at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from torch import nn

if TYPE_CHECKING:
    from qkv.models.gpt.config import GPTConfig
    from qkv.models.rnnsearch.config import RNNSearchConfig
    from qkv.models.transformer.config import TransformerConfig


def decoder_config(model: nn.Module) -> GPTConfig:
    """The config of a decoder-only model (GPT, Llama): context_length, vocab_size, n_kv_heads, head_dim, ..."""
    return cast("GPTConfig", model.config)


def translator_config(model: nn.Module) -> TransformerConfig | RNNSearchConfig:
    """The config of a translator: src_vocab_size, tgt_vocab_size and the longest sentence, context_length."""
    return cast("TransformerConfig | RNNSearchConfig", model.config)
