"""Configs validate themselves with messages that say what to change, and round-trip through JSON."""

from __future__ import annotations

import json
import re

import pytest

from qkv.errors import QkvError
from qkv.models import GPTConfig, TransformerConfig
from qkv.models.config import BaseConfig


def test_heads_must_divide_width_and_the_message_says_what_to_change() -> None:
    with pytest.raises(QkvError) as info:
        GPTConfig(d_model=130, n_heads=4)
    message = str(info.value)
    assert "d_model=130" in message and "n_heads=4" in message
    assert "[1, 2, 5, 10, 13, 26]" in message and "d_model=128 or 132" in message


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(dropout=1.5), "dropout=1.5"),
        (dict(activation="tanh"), "activation='tanh'"),
        (dict(positional="alibi"), "positional='alibi'"),
        (dict(d_model=12, n_heads=4, positional="rope"), "even head size"),
        (dict(n_layers=0), "n_layers=0"),
        (dict(vocab_size=-3), "vocab_size=-3"),
    ],
)
def test_bad_values_are_named(kwargs, fragment) -> None:
    with pytest.raises(QkvError, match=fragment.replace("[", r"\[").replace("(", r"\(")):
        GPTConfig(**kwargs)


def test_shared_embeddings_need_one_vocabulary() -> None:
    with pytest.raises(QkvError, match="share_embeddings"):
        TransformerConfig(src_vocab_size=10, tgt_vocab_size=12, share_embeddings=True)


def test_defaults_follow_the_paper() -> None:
    config = GPTConfig(d_model=512, n_heads=8)
    assert config.d_ff == 2048 and config.head_dim == 64
    assert config.attention_dropout == config.dropout and config.final_norm is True


def test_json_round_trip(tmp_path) -> None:
    for config in (GPTConfig(d_model=64, n_heads=2, positional="rope"), TransformerConfig(context_length=77)):
        path = tmp_path / "config.json"
        config.save(path)
        assert BaseConfig.load(path) == config
        assert json.loads(path.read_text())["model"] == config.kind


def test_unknown_fields_and_kinds_are_named(tmp_path) -> None:
    with pytest.raises(QkvError, match="unknown fields \\['n_embd'\\]"):
        BaseConfig.from_dict({"model": "gpt", "n_embd": 3})
    with pytest.raises(QkvError, match="unknown model kind 'rnn'"):
        BaseConfig.from_dict({"model": "rnn"})
    broken = tmp_path / "config.json"
    broken.write_text("{not json")
    with pytest.raises(QkvError, match="not valid JSON"):
        BaseConfig.load(broken)


def test_configs_saved_with_max_len_load_as_context_length() -> None:
    """qkv before 0.2 named an encoder's or translator's length max_len; those config.json files still load."""
    from qkv.models import TransformerConfig
    from qkv.models.config import BaseConfig
    from qkv.models.presets import make_config

    old = {"model": "transformer", "max_len": 77, "d_model": 32, "n_heads": 2}
    config = BaseConfig.from_dict(old)
    assert isinstance(config, TransformerConfig) and config.context_length == 77
    assert make_config("transformer-tiny", max_len=40).context_length == 40
    assert "max_len" not in config.to_dict()


def test_every_model_has_context_length() -> None:
    from qkv.models import EncoderConfig, GPTConfig, TransformerConfig

    for cls in (GPTConfig, EncoderConfig, TransformerConfig):
        assert cls(context_length=33).context_length == 33
        with pytest.raises(QkvError, match="context_length"):
            cls(context_length=0)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"d_model": "64"}, "d_model='64' must be a whole number"),  # 4 * "64" made d_ff "64646464"
        ({"n_layers": 1e8}, "n_layers=100000000.0 must be a whole number"),
        ({"n_heads": True}, "n_heads=True must be a whole number"),
        ({"dropout": "0.1"}, "dropout='0.1' must be a finite number"),
        ({"rope_base": float("nan")}, "rope_base=nan must be a finite number"),
        ({"rope_base": float("inf")}, "rope_base=inf must be a finite number"),  # was saved as Infinity in config.json
        ({"rope_base": 0.0}, "rope_base=0.0 must be above 0"),
        ({"rope_base": -1.0}, "rope_base=-1.0 must be above 0"),
        ({"tie_embeddings": "yes"}, "tie_embeddings='yes' must be true or false"),
        ({"d_ff": "x"}, "d_ff='x' must be a whole number or null"),
    ],
)
def test_every_field_holds_its_declared_type(settings, message) -> None:
    from qkv.models.llama import LlamaConfig

    with pytest.raises(QkvError, match=re.escape(message)):
        LlamaConfig(vocab_size=10, **settings)
    assert LlamaConfig(vocab_size=10, dropout=0, rope_base=500000).rope_base == 500000  # ints are numbers


def test_a_config_says_whether_it_rotates_and_its_block_widths() -> None:
    """The questions the model base and the memory estimates ask a config instead of testing its class."""
    from qkv.models import LlamaConfig, RNNSearchConfig
    from qkv.models.config import BlockSizes
    from qkv.models.rnnsearch import RNNSearch

    llama = LlamaConfig(d_model=64, n_heads=8, n_kv_heads=2, n_layers=1, d_ff=96, vocab_size=10)
    assert llama.rotary() and not GPTConfig(vocab_size=10).rotary() and not RNNSearchConfig().rotary()
    assert llama.block_sizes() == BlockSizes(d_ff=96, kv_dim=16, heads=8, gated=True)
    assert GPTConfig(vocab_size=10, d_model=32, n_heads=4).block_sizes() == BlockSizes(128, 32, 4, False)
    assert RNNSearchConfig().block_sizes() is None
    assert RNNSearch(RNNSearchConfig(src_vocab_size=10, tgt_vocab_size=10)).rotary is None
