"""The Protocols of qkv.server.config_shape name fields every served family's config really has."""

from __future__ import annotations

import pytest

from qkv.models.gpt.config import GPTConfig
from qkv.models.llama.config import LlamaConfig
from qkv.models.rnnsearch.config import RNNSearchConfig
from qkv.models.transformer.config import TransformerConfig
from qkv.server.config_shape import DecoderConfig, ServedConfig, TranslatorConfig


def _fields(protocol: type) -> set[str]:
    """The properties a Protocol declares, its bases' included."""
    names: set[str] = set()
    for cls in protocol.__mro__:
        names |= {name for name, value in vars(cls).items() if isinstance(value, property)}
    return names


@pytest.mark.parametrize(
    ("config", "protocol"),
    [
        (GPTConfig(), DecoderConfig),
        (LlamaConfig(), DecoderConfig),
        (TransformerConfig(), TranslatorConfig),
        (RNNSearchConfig(), TranslatorConfig),
    ],
)
def test_every_served_config_answers_its_protocol_with_positive_ints(config, protocol) -> None:
    names = _fields(protocol)
    assert _fields(ServedConfig) <= names and {"context_length", "n_heads", "d_model"} <= names
    for name in names:
        value = getattr(config, name)
        assert isinstance(value, int) and value > 0, (type(config).__name__, name, value)


def test_rnnsearch_answers_as_one_head_and_one_layer_per_stack() -> None:
    config = RNNSearchConfig(d_hidden=24)
    assert (config.n_heads, config.n_encoder_layers, config.n_decoder_layers) == (1, 1, 1)
