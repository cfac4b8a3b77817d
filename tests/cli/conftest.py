"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import pytest

from qkv.cli import main
from tests.cli.test_bad_input import GOOD_TEXT, train_args


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A gpt-nano run trained for 4 steps on a small text (data.txt beside it), by `qkv train` itself."""
    root = tmp_path_factory.mktemp("tiny")
    data = root / "data.txt"
    data.write_text(GOOD_TEXT)
    assert main(train_args(data, root / "run")) == 0
    return root / "run"
