"""Bad input gets one line naming the problem and the fix, exit code 2, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main

GOOD_TEXT = "hello world, this is a small corpus for a small model.\n" * 40


def run_cli(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    return code, err


def assert_one_line_error(code: int, err: str, fragment: str) -> None:
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert fragment in lines[0], lines[0]


def refused(capsys, argv: list[str], fragment: str) -> None:
    """``qkv ARGV`` fails with one line holding ``fragment`` (exit code 2, no traceback)."""
    assert_one_line_error(*run_cli(capsys, *argv), fragment)


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "--data",
        str(data),
        "--out-dir",
        str(out),
        "--preset",
        "gpt-nano",
        "--steps",
        "4",
        "--warmup-steps",
        "1",
        "--eval-interval",
        "2",
        "--eval-batches",
        "1",
        "--quiet",
        "--no-samples",
        *extra,
    ]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "does not exist"),
        (b"", "is empty"),
        (b"\x00\x01\x02binary\x00", "looks binary"),
        ("caf\xe9 au lait\n".encode("latin-1") * 10, "byte 0xe9"),
        (b"tiny", "shorter than one context window"),
    ],
)
def test_bad_data_files(tmp_path, capsys, content, fragment) -> None:
    data = tmp_path / "data.txt"
    if content is not None:
        data.write_bytes(content)
    assert_one_line_error(*run_cli(capsys, *train_args(data, tmp_path / "run")), fragment)


def test_contradicting_flags(tmp_path, capsys) -> None:
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    code, err = run_cli(capsys, *train_args(data, tmp_path / "run", "--d-model", "30", "--n-heads", "4"))
    assert_one_line_error(code, err, "d_model=30 is not divisible by n_heads=4")


def test_bad_run_directories(tmp_path, capsys) -> None:
    assert_one_line_error(*run_cli(capsys, "generate", str(tmp_path / "nope")), "does not exist")
    assert_one_line_error(*run_cli(capsys, "generate", str(tmp_path)), "not a qkv run directory")
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    run = tmp_path / "run"
    assert main(train_args(data, run)) == 0
    capsys.readouterr()

    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 5}))
    assert_one_line_error(*run_cli(capsys, "generate", str(run)), "the files come from different runs")
    (run / "config.json").write_text(json.dumps(config))

    weights = (run / "model.safetensors").read_bytes()
    (run / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    assert_one_line_error(*run_cli(capsys, "generate", str(run)), "damaged or truncated")
    checkpoint = run / "checkpoints"
    assert checkpoint.is_dir() and any(checkpoint.iterdir())  # the resumable checkpoint is untouched


def test_resume_of_something_that_is_not_a_run(tmp_path, capsys) -> None:
    assert_one_line_error(*run_cli(capsys, "train", "--resume", str(tmp_path)), "not a training run")
