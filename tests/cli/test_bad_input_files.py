"""Damaged files in a run directory: one line that names the file and the real problem, exit code 2, or
(for a damaged metrics line) the run goes on without it."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.cli import main
from tests.cli.test_bad_input import assert_one_line_error, run_cli


@pytest.fixture
def run(tiny_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(tiny_run, copy)
    return copy


def _nan_weights(run) -> None:
    weights = load_file(run / "model.safetensors")
    save_file({k: torch.full_like(v, float("nan")) for k, v in weights.items()}, run / "model.safetensors")


DAMAGE = [
    ("tokenizer.json", lambda run: (run / "tokenizer.json").write_text('{"kind": "char", "vocab": 5'), ["generate"],
     "tokenizer file {run}/tokenizer.json is not valid JSON"),
    ("trainer_state.json", lambda run: (run / "checkpoints" / "step-000004" / "trainer_state.json").write_text("x"),
     ["train", "--resume", "{run}", "--steps", "8", "--quiet", "--no-samples"], "trainer_state.json is not valid JSON"),
    ("NaN weights", _nan_weights, ["generate"], "hold NaN (tensor "),
]  # fmt: skip


@pytest.mark.parametrize(("name", "damage", "command", "fragment"), DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_files(run, capsys, name, damage, command, fragment) -> None:
    damage(run)
    args = [a.format(run=run) for a in command] if len(command) > 1 else [command[0], str(run)]
    assert_one_line_error(*run_cli(capsys, *args), fragment.format(run=run))


@pytest.mark.parametrize("command", [["plot", "{run}"], ["train", "--resume", "{run}", "--steps", "6", "--quiet"]])
def test_metrics_with_bytes_that_are_not_utf8(run, capsys, command) -> None:
    with open(run / "metrics.jsonl", "ab") as metrics:
        metrics.write(b"\xff\xfe{not json\n")
    assert main([a.format(run=run) for a in command] + (["--no-samples"] if command[0] == "train" else [])) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_plot_of_a_missing_folder(tmp_path, capsys) -> None:
    assert_one_line_error(*run_cli(capsys, "plot", str(tmp_path / "nope")), "does not exist")
