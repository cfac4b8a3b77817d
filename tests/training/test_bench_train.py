"""The training benchmarks run end to end here and measure what they say (no timing assertions): the GPU
bench in its reduced CPU mode, and the probes that find when a run reaches a loss without changing it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from qkv.training import TrainConfig, train_language_model
from qkv.training.metrics import read_metrics

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    """Import a script of bench/ by name (they import their neighbours, so bench/ goes on sys.path)."""
    monkeypatch.syspath_prepend(str(BENCH))

    def load(name: str):
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    return load


TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


def config(tmp_path, name: str) -> TrainConfig:
    (tmp_path / "text.txt").write_text(TEXT)
    return TrainConfig(
        data=str(tmp_path / "text.txt"),
        out_dir=str(tmp_path / name),
        preset="gpt-nano",
        model={"context_length": 16, "dropout": 0.1},
        steps=12,
        batch_size=4,
        warmup_steps=1,
        eval_interval=6,
        eval_batches=4,
        log_interval=2,
        device="cpu",  # the runs compared bit for bit: a GPU's parallel sums have no fixed order
    )


def test_probing_for_a_loss_changes_nothing_in_the_run(tmp_path, bench) -> None:
    target = bench("loss_target").LossTarget(3.0, probe_interval=2, probe_batches=1, margin=10.0)
    plain = train_language_model(config(tmp_path, "plain"), quiet=True)
    probed = train_language_model(config(tmp_path, "probed"), quiet=True, on_step=target)

    def without_speed(run_dir) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in read_metrics(run_dir)]

    assert without_speed(probed.run_dir) == without_speed(plain.run_dir)  # the same losses and evaluations
    assert target.step is not None and target.step % 2 == 0 and target.loss <= 3.0
    assert 0 < target.train_seconds <= target.wall_seconds and target.probe_seconds > 0

    stopping = bench("loss_target").LossTarget(3.0, probe_interval=2, probe_batches=1, margin=10.0, stop=True)
    stopped = train_language_model(config(tmp_path, "stopped"), quiet=True, on_step=stopping)
    assert stopped.stopped == "interrupted" and stopped.step == stopping.step == target.step


def test_the_gpu_bench_runs_end_to_end_in_its_cpu_mode(bench, capsys) -> None:
    rows = bench("train_gpu").main(["--cpu-smoke", "--steps", "10", "--no-eager"])
    assert {(r["config"], r["optimizer"]) for r in rows} == {
        (c, o) for c in ("char", "gpt2") for o in ("adamw", "muon")
    }
    for row in rows:
        assert row["steps"] == 10 or row["reach"] is not None  # the char runs may stop at their target
        assert row["tokens_per_s"] > 0 and row["ms_per_step"] > 0 and row["flops_per_token"] > 0
    out = capsys.readouterr().out
    assert "x nanoGPT compiled" in out and "muon's step is" in out and "matmul peak" in out
