"""A ``--config`` TOML file: its settings with the flags' names, broken TOML named, and every value checked
against its field's type, even one that a flag replaces."""

from __future__ import annotations

import argparse

import pytest

from qkv.errors import QkvError
from qkv.training.config_file import read_toml


def test_toml_file(tmp_path) -> None:
    path = tmp_path / "run.toml"
    path.write_text("steps = 50\nbatch-size = 4\n[model]\nd_model = 64\n")
    assert read_toml(path) == {"steps": 50, "batch_size": 4, "model": {"d_model": 64}}
    path.write_text("steps = = 3")
    with pytest.raises(QkvError, match="not valid TOML"):
        read_toml(path)


def test_a_toml_value_is_checked_even_when_a_flag_replaces_it(tmp_path) -> None:
    from qkv.cli.train import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = tmp_path / "run.toml"
    path.write_text("steps = 1.5\n")
    with pytest.raises(QkvError, match=r"run.toml: setting steps = 1.5 must be a whole number"):
        config_from_args(parser.parse_args(["--config", str(path), "--steps", "40"]))
    path.write_text("steps = 15\n")
    assert config_from_args(parser.parse_args(["--config", str(path), "--steps", "40"])).steps == 40
