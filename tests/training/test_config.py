"""Training settings: validation with flag names, TOML files."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.training.config import TrainConfig, flag_names


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (dict(steps=0), "--steps"),
        (dict(batch_size=-1), "--batch-size"),
        (dict(schedule="exponential"), "--schedule 'exponential'"),
        (dict(warmup_steps=500, steps=100), "--warmup-steps 500"),
        (dict(lr=0.0), "--lr"),
        (dict(val_fraction=1.0), "--val-fraction"),
        (dict(vocab_size=500), "--tokenizer bpe"),
        (dict(task="classify"), "--task 'classify'"),
        (dict(arch="cbow"), "--arch .cbow. is not an architecture of --task lm: choose one of gpt, llama"),
        (dict(task="translate", arch="llama"), "choose one of transformer, rnnsearch"),
        (dict(window=3), "--window are for --task word2vec"),
        (dict(compile="yes"), "--compile 'yes'"),
        (dict(strategy="zero3"), "--strategy 'zero3'"),
    ],
)
def test_bad_settings_name_the_flag(kwargs, fragment) -> None:
    with flag_names(), pytest.raises(QkvError, match=fragment.replace("(", r"\(")):  # as the command line sees them
        TrainConfig(**kwargs)


def test_defaults_fill_in() -> None:
    config = TrainConfig(lr=2e-3, eval_interval=50)
    assert config.min_lr == pytest.approx(2e-4) and config.checkpoint_interval == 50


def test_unknown_settings_are_named() -> None:
    with pytest.raises(QkvError, match="unknown training settings \\['stepz'\\]"):
        TrainConfig.from_dict({"stepz": 3})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        (dict(window=0), "--window must be a positive"),
        (dict(negative=0), "--negative must be a positive"),
        (dict(min_count=0), "--min-count must be a positive"),
        (dict(sample=1.5), "--sample must be in"),
        (dict(arch="rnnsearch"), "choose one of skipgram, cbow"),
        (dict(optimizer="adamw"), "--optimizer sgd"),
        (dict(tokenizer="bpe"), "--tokenizer word"),
        (dict(compile="on"), "drop --compile"),
        (dict(strategy="fsdp"), "drop --compile and --strategy fsdp"),
    ],
)
def test_word2vec_settings_are_checked(changes, fragment) -> None:
    with flag_names(), pytest.raises(QkvError, match=fragment):
        TrainConfig.create(task="word2vec", **changes)


def test_word2vec_defaults_are_word2vecs() -> None:
    config = TrainConfig.create(task="word2vec")
    assert (config.arch, config.lr, config.min_lr, config.schedule, config.optimizer) == (
        "skipgram",
        0.025,
        0.0001,
        "linear",
        "sgd",
    )
    assert (config.window, config.negative, config.min_count, config.sample, config.epochs) == (5, 5, 5, 1e-3, 5)
    assert TrainConfig.create(task="word2vec", steps=9).epochs is None


def test_compile_and_strategy_from_flags_and_toml(tmp_path) -> None:
    import argparse

    from qkv.cli.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def settings(*argv: str) -> TrainConfig:
        return config_from_args(parser.parse_args(list(argv)))

    assert settings().compile == "auto" and settings().strategy == "ddp"
    assert settings("--compile").compile == "on"  # the bare flag
    assert settings("--compile", "off").compile == "off"
    assert settings("--strategy", "fsdp").strategy == "fsdp"
    assert settings("--shared-vocab", "false").shared_vocab is False  # bool flags read "false" as False
    path = tmp_path / "run.toml"
    path.write_text("compile = true\nstrategy = 'fsdp'\n")
    config = settings("--config", str(path))
    assert config.compile == "on" and config.strategy == "fsdp"
    assert TrainConfig(compile=False).compile == "off"
