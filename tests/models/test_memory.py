"""The memory estimate: parameters counted without allocating equal PyTorch's count of the built model."""

from __future__ import annotations

import pytest
import torch

from qkv.errors import QkvError
from qkv.model_dir import build_model
from qkv.models import make_config
from qkv.models.memory import available_memory, check_fits, parameter_count


@pytest.mark.parametrize(
    ("preset", "changes"),
    [
        ("gpt-nano", {"vocab_size": 50, "n_layers": 5}),
        ("transformer-tiny", {"src_vocab_size": 40, "tgt_vocab_size": 40, "n_encoder_layers": 3}),
        ("rnnsearch-small", {"src_vocab_size": 30, "tgt_vocab_size": 30}),
    ],
)
def test_parameter_count_equals_the_built_models(preset, changes) -> None:
    config = make_config(preset, **changes)
    assert parameter_count(config) == sum(p.numel() for p in build_model(config).parameters())


def test_available_memory_is_positive_and_below_total() -> None:
    free = available_memory("cpu")
    assert free is not None and 0 < free
    with open("/proc/meminfo") as meminfo:
        total = int(meminfo.readline().split()[1]) * 1024
    assert free <= total


def test_check_fits_refuses_with_the_figure() -> None:
    config = make_config("gpt-nano", vocab_size=50, n_layers=10**7)
    with pytest.raises(QkvError, match=r"does not fit: its [\d,]+ parameters need [\d.]+ GiB, but cpu has"):
        check_fits(config, torch.device("cpu"))
    check_fits(make_config("gpt-nano", vocab_size=50), torch.device("cpu"), batch_size=4)  # fits: no error
