"""Hyperparameters read from GGUF metadata: every value qkv would build a broken model from is one line."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.gguf.metadata import ArchMetadata


def meta(**values) -> ArchMetadata:
    return ArchMetadata({f"llama.{k.replace('__', '.')}": v for k, v in values.items()}, "llama")


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "30", None])
def test_counts_must_be_positive_whole_numbers(value):
    with pytest.raises(QkvError, match=r"llama\.block_count") as error:
        meta(block_count=value).count("block_count")
    assert "\n" not in str(error.value)


def test_counts_per_layer_and_defaults():
    with pytest.raises(QkvError, match="per layer"):
        meta(attention__head_count_kv=[3, 3]).count("attention.head_count_kv")
    assert meta().count("attention.head_count_kv", 9) == 9
    assert meta(vocab_size=7).vocab_size() == 7
    assert ArchMetadata({"tokenizer.ggml.tokens": ["a", "b"]}, "llama").vocab_size() == 2


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -1e-5])
def test_epsilons_must_be_positive_and_finite(value):
    with pytest.raises(QkvError, match="must be a positive number"):
        meta(attention__layer_norm_rms_epsilon=value).positive("attention.layer_norm_rms_epsilon")


def test_rope():
    assert meta().rope_base(64) == 10000.0 and meta(rope__freq_base=1e6).rope_base(64) == 1e6
    assert meta(rope__scaling__type="linear", rope__scaling__factor=1.0).rope_base(64) == 10000.0  # no scaling
    with pytest.raises(QkvError, match="rotates part of each head"):
        meta(rope__dimension_count=32).rope_base(64)
    with pytest.raises(QkvError, match="scales RoPE"):
        meta(rope__scale_linear=2.0).rope_base(64)
    with pytest.raises(QkvError, match="key_length=32"):
        meta(attention__key_length=32).check_head_dim(64)
