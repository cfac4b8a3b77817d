"""TrainConfig used from Python: the defaults fit a short run as on the command line, and messages name the
Python fields (the command line's flags only inside ``flag_names``)."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.training.config import WARMUP_STEPS, TrainConfig, flag_names


def test_a_short_run_gets_a_short_warmup_as_on_the_command_line() -> None:
    assert TrainConfig(steps=30).warmup_steps == 3  # the README's example: the default 100 would not fit
    assert TrainConfig(steps=30).warmup_steps == TrainConfig.create(steps=30).warmup_steps
    assert TrainConfig(steps=500).warmup_steps == WARMUP_STEPS
    assert TrainConfig(steps=30, warmup_steps=5).warmup_steps == 5
    assert TrainConfig(steps=30, schedule="noam").warmup_steps == WARMUP_STEPS  # noam's warmup may exceed the run


@pytest.mark.parametrize(
    ("kwargs", "python", "flags"),
    [
        (dict(steps=0), "steps must be a positive whole number", "--steps must be"),
        (dict(warmup_steps=50, steps=30), "warmup_steps=50 must be between 0 and steps (30)", "--warmup-steps 50"),
        (dict(schedule="exponential"), "schedule='exponential' is unknown", "--schedule 'exponential' is unknown"),
        (dict(vocab_size=500), "add tokenizer='bpe'", "add --tokenizer bpe"),
        (dict(window=3), "window are for task='word2vec'", "--window are for --task word2vec"),
    ],
)
def test_messages_name_python_fields_and_flags_only_on_the_command_line(kwargs, python, flags) -> None:
    with pytest.raises(QkvError) as error:
        TrainConfig(**kwargs)
    assert python in str(error.value) and "--" not in str(error.value)
    with flag_names(), pytest.raises(QkvError) as error:
        TrainConfig(**kwargs)
    assert flags in str(error.value)
