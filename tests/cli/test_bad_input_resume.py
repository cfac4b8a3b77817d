"""Resuming after a kill, a full disk or a wrong --steps: the run goes on (or one line says how), the logged
loss is the uninterrupted run's, and nothing half-written is left behind."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest

from qkv.cli import main
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.config import TrainConfig
from qkv.training.metrics import read_metrics
from qkv.training.tasks.language_model import train_language_model
from tests.cli.test_bad_input import GOOD_TEXT, assert_one_line_error, run_cli, train_args

SETTINGS = dict(
    preset="gpt-nano",
    steps=12,
    warmup_steps=1,
    schedule="constant",
    eval_interval=4,
    eval_batches=1,
    log_interval=5,
    threads=1,
)


def _data(tmp_path):
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    return data


def _train_losses(run) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in read_metrics(run) if "train_loss" in r}


def test_the_logged_loss_after_a_resume_equals_the_uninterrupted_runs(tmp_path, capsys) -> None:
    data = _data(tmp_path)
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train_language_model(TrainConfig.create(data=str(data), out_dir=str(whole), **SETTINGS), quiet=True)

    def stop_at_7(trainer, step, loss) -> None:  # noqa: ARG001  (Ctrl-C at step 7: between two log rows)
        if step == 7:
            trainer.request_stop()

    interrupted = train_language_model(
        TrainConfig.create(data=str(data), out_dir=str(cut), **SETTINGS), quiet=True, on_step=stop_at_7
    )
    assert interrupted.stopped == "interrupted" and interrupted.step == 7
    assert main(["train", "--resume", str(cut), "--quiet", "--no-samples"]) == 0
    expected, got = _train_losses(whole), _train_losses(cut)
    assert sorted(got) == sorted(expected) == [5, 10, 12]
    assert got[10] == pytest.approx(expected[10], rel=1e-6)  # the window 6..10 spans the interruption
    assert got == pytest.approx(expected, rel=1e-6)


def test_leftovers_of_a_kill_are_removed_on_resume(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run)) == 0
    leftovers = [
        run / ".model.safetensors.k3j2.tmp",
        run / "checkpoints" / ".latest.json.x81a.tmp",
        run / "checkpoints" / ".tmp-step-000006-abcd",
    ]
    leftovers[0].write_bytes(b"half")
    leftovers[1].write_text("{")
    leftovers[2].mkdir()
    assert main(["train", "--resume", str(run), "--steps", "6", "--quiet", "--no-samples"]) == 0
    assert not any(path.exists() for path in leftovers)
    assert latest_checkpoint(run).name == "step-000006"


def test_a_run_killed_before_its_first_checkpoint_restarts(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run)) == 0
    # What a kill before the first checkpoint leaves: the model's description and settings, no weights.
    for name in ("checkpoints", "model.safetensors"):
        path = run / name
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train_loss": 9.0}) + "\n")
    assert_one_line_error(*run_cli(capsys, *train_args(_data(tmp_path), run)), "already holds a training run")
    code = main(["train", "--resume", str(run), "--no-samples"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "was stopped before its first checkpoint: starting it again from step 0" in err
    assert latest_checkpoint(run).name == "step-000004"
    assert 9.0 not in [r.get("train_loss") for r in read_metrics(run)]  # the killed run's rows are gone


@pytest.mark.parametrize("where", ["checkpoint pointer", "weights"])
def test_a_full_disk_mid_run(tmp_path, capsys, monkeypatch, where) -> None:
    import qkv.storage
    import qkv.training.checkpoint

    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run, "--steps", "4")) == 0
    kept = latest_checkpoint(run)
    if where == "checkpoint pointer":

        def full(path, data) -> None:  # noqa: ARG001
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

        monkeypatch.setattr(qkv.training.checkpoint, "atomic_write_json", full)
        fragment = "latest.json (No space left on device)"
    else:
        from safetensors import SafetensorError

        def full(*args, **kwargs) -> None:  # noqa: ARG001
            raise SafetensorError("Error while serializing: IoError(No space left on device)")

        monkeypatch.setattr(qkv.storage, "save_file", full)
        fragment = ".safetensors (Error while serializing"
    code, err = run_cli(capsys, "train", "--resume", str(run), "--steps", "8", "--quiet", "--no-samples")
    assert_one_line_error(code, err, fragment)
    assert f"the last checkpoint {kept} is intact" in err and f"qkv train --resume {run}" in err
    monkeypatch.undo()
    assert main(["train", "--resume", str(run), "--steps", "8", "--quiet", "--no-samples"]) == 0
    assert latest_checkpoint(run).name == "step-000008"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_run_directory(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run)) == 0
    for path in (run, run / "checkpoints"):
        path.chmod(0o555)
    try:
        code, err = run_cli(capsys, "train", "--resume", str(run), "--steps", "8", "--quiet", "--no-samples")
    finally:
        for path in (run, run / "checkpoints"):
            path.chmod(0o755)
    assert_one_line_error(code, err, "could not write")
    assert "is intact" in err


def test_max_time_stops_with_a_checkpoint(tmp_path, capsys) -> None:
    run = tmp_path / "run"
    code = main(train_args(_data(tmp_path), run, "--steps", "100000", "--max-time", "0.0001"))
    assert code == 0
    latest = latest_checkpoint(run)
    assert latest is not None and int(latest.name.removeprefix("step-")) < 100000
    assert (run / "model.safetensors").is_file()


def test_short_runs_fit_the_default_warmup(tmp_path, capsys) -> None:
    args = [a for a in train_args(_data(tmp_path), tmp_path / "run", "--steps", "40") if a != "--quiet"]
    warm = args.index("--warmup-steps")
    del args[warm : warm + 2]
    assert main(args) == 0
    assert "warmup shortened to 4 steps" in capsys.readouterr().err
    settings = json.loads((tmp_path / "run" / "train_config.json").read_text())["train"]
    assert settings["warmup_steps"] == 4


def test_a_relative_data_path_that_no_longer_resolves(tiny_run, tmp_path, capsys, monkeypatch) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    settings = json.loads((run / "train_config.json").read_text())
    settings["train"]["data"] = "data.txt"  # as if started with --data data.txt in tiny_run's parent
    (run / "train_config.json").write_text(json.dumps(settings))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, err = run_cli(capsys, "train", "--resume", str(run), "--steps", "6", "--quiet", "--no-samples")
    assert_one_line_error(code, err, "is a relative path that does not exist from")
    assert "give its path with --data" in err
    assert main(["train", "--resume", str(run), "--steps", "6", "--quiet", "--no-samples"]
                + ["--data", str(tiny_run.parent / "data.txt")]) == 0  # fmt: skip


def test_a_missing_checkpoint_pointer_is_said_once(tmp_path, capsys, recwarn) -> None:
    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run)) == 0
    (run / "checkpoints" / "latest.json").unlink()
    assert main(["train", "--resume", str(run), "--steps", "6", "--quiet", "--no-samples"]) == 0
    said = [str(w.message) for w in recwarn if "latest.json is missing" in str(w.message)]
    assert len(said) == 1, said  # it was given three times, from three callers


def test_resuming_a_checkpoint_with_nan_weights(tmp_path, capsys) -> None:
    """A checkpoint saved after the weights went NaN (older qkv saved them) is named for what it is."""
    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    assert main(train_args(_data(tmp_path), run)) == 0
    weights = latest_checkpoint(run) / "model.safetensors"
    save_file({k: torch.full_like(v, float("nan")) for k, v in load_file(weights).items()}, weights)
    code, err = run_cli(capsys, "train", "--resume", str(run), "--steps", "8", "--quiet", "--no-samples")
    assert_one_line_error(code, err, f"the checkpoint {latest_checkpoint(run)} holds NaN or infinite weights")
    assert "last good" not in err


def test_max_time_fits_the_learning_rate_schedule_to_the_time(tmp_path, capsys, monkeypatch) -> None:
    """A run that --max-time stops long before --steps still warms up and decays: the schedule spans the steps that
    fit (it stayed in a warmup planned for --steps). The clock is a fake that advances 5 ms per reading."""
    import time

    now = [0.0]

    def clock() -> float:
        now[0] += 0.005
        return now[0]

    monkeypatch.setattr(time, "perf_counter", clock)
    run = tmp_path / "run"
    args = ["train", "--data", str(_data(tmp_path)), "--out", str(run), "--preset", "gpt-nano", "--steps", "10000",
            "--warmup-steps", "100", "--eval-interval", "1000", "--eval-batches", "1", "--log-interval", "5",
            "--max-time", "3s", "--no-samples"]  # fmt: skip
    assert main(args) == 0
    assert "fits about" in capsys.readouterr().err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lrs = [row["lr"] for row in rows if "lr" in row]
    assert len(lrs) >= 4 and max(lrs) > 2 * lrs[-1]  # it rose and fell again, not a warmup cut short
    assert lrs.index(max(lrs)) < len(lrs) - 2
