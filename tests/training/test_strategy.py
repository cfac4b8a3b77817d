"""DDP and FSDP on two CPU processes (gloo) train like one process with the same global batch, write the
same checkpoints as one process, and an FSDP run resumes exactly (also in one process); Muon's shared
Newton-Schulz equals one process's; on a folder written by ``qkv prepare`` the two DDP processes train on
disjoint windows, together the global batch one process draws.

One ``torchrun`` launch (tests/training/distributed_worker.py) makes every two-process run; the
single-process runs they are compared with are made here. Tolerances: two processes differ from one only
in the order of floating-point sums (each process averages its rows, then the processes average; FSDP's
reduce-scatter adds shards in its own order), about 1e-7 relative per sum in float32; after 6 steps of
Muon or AdamW the losses agree to about 1e-7 and the weights to about 1e-6, so 1e-5 leaves a margin while
any real difference (a wrong shard, a missing average, a stale momentum) is 1e-3 or more.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.data.prepare import prepare
from qkv.training import train_language_model
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.metrics import read_metrics
from tests.training import distributed_worker as worker

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

WORKER = Path(worker.__file__)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("strategies")
    (out / "text.txt").write_text(worker.TEXT)
    (out / "random.txt").write_text(worker.RANDOM_TEXT)
    prepare(str(out / "random.txt"), out / worker.PREPARED, quiet=True)
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        str(out),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(launcher, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def one_process(runs):
    """The same runs in this process with the whole global batch (2 processes x 2 rows = 4 rows), by optimizer."""
    made: dict[tuple[str, str], Path] = {}

    def run_dir(optimizer: str, family: str = "gpt") -> Path:
        if (optimizer, family) not in made:
            model = worker.LLAMA if family == "llama" else {}
            name = f"one-{family}-{optimizer}"
            config = worker.settings(runs, name, batch_size=4, threads=None, optimizer=optimizer, **model)
            made[optimizer, family] = train_language_model(config, quiet=True).run_dir
        return made[optimizer, family]

    return run_dir


def train_losses(run_dir: Path) -> list[float]:
    return [row["train_loss"] for row in read_metrics(run_dir) if "train_loss" in row]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run_dir) / "model.safetensors"))


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)


@pytest.mark.parametrize(
    ("two", "optimizer", "family"),
    [("ddp", "muon", "gpt"), ("fsdp", "muon", "gpt"), ("fsdp-adamw", "adamw", "gpt"), ("fsdp-llama", "muon", "llama")],
)
def test_two_processes_train_like_one_with_the_same_global_batch(runs, one_process, two, optimizer, family) -> None:
    single = one_process(optimizer, family)
    expected = train_losses(single)
    assert len(expected) == 6 and expected[-1] < expected[0] - 0.5  # it learns: not six equal numbers
    torch.testing.assert_close(train_losses(runs / two), expected, atol=0, rtol=1e-5)
    assert_same_weights(weights(runs / two), weights(single))


def test_an_fsdp_run_resumes_exactly(runs) -> None:
    assert train_losses(runs / "fsdp-split") == train_losses(runs / "fsdp")  # bit for bit
    a, b = weights(runs / "fsdp-split"), weights(runs / "fsdp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_compiled_fsdp_run_trains_like_the_eager_one(runs) -> None:
    torch.testing.assert_close(train_losses(runs / "fsdp-compiled"), train_losses(runs / "fsdp"), atol=0, rtol=1e-5)
    assert_same_weights(weights(runs / "fsdp-compiled"), weights(runs / "fsdp"))


def test_an_fsdp_checkpoint_is_a_one_process_checkpoint(runs, one_process, tmp_path) -> None:
    """Same tensors (names, shapes, dtypes) and settings as one process's, and one process resumes it."""
    single = one_process("muon")
    for file in ("model.safetensors", "optimizer.safetensors"):
        mine = load_file(str(latest_checkpoint(single) / file))
        sharded = load_file(str(latest_checkpoint(runs / "fsdp") / file))
        assert {k: (v.shape, v.dtype) for k, v in mine.items()} == {k: (v.shape, v.dtype) for k, v in sharded.items()}
    groups = [
        json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())["optimizer"]["param_groups"]
        for run in (single, runs / "fsdp")
    ]
    assert groups[0] == groups[1]

    moved = tmp_path / "resumed-alone"  # the FSDP run's step-3 checkpoint, continued by one process
    shutil.copytree(runs / "fsdp-split", moved)
    (moved / "checkpoints" / "latest.json").write_text(json.dumps({"step": 3, "dir": "step-000003"}))
    alone = worker.settings(runs, "unused", batch_size=4, threads=None)
    resumed = train_language_model(alone, resume=moved, quiet=True)
    assert resumed.step == 6
    torch.testing.assert_close(train_losses(moved), train_losses(single), atol=0, rtol=1e-5)
    assert_same_weights(weights(moved), weights(single))


def test_shared_newton_schulz_equals_one_process(runs) -> None:
    result = load_file(str(runs / "newton_schulz.safetensors"))
    assert result["shared"].shape == (5, 24, 16)
    torch.testing.assert_close(result["shared"], result["alone"], atol=1e-6, rtol=0)


def test_ddp_ranks_read_disjoint_windows_of_prepared_shards(runs, monkeypatch) -> None:
    ranks = [load_file(str(runs / f"windows-rank{r}.safetensors"))["windows"] for r in range(2)]  # (steps, 2, T)
    with worker.recorded_windows() as seen:
        config = worker.settings(runs, "one-prepared", data=str(runs / worker.PREPARED), batch_size=4, threads=None)
        single = train_language_model(config, quiet=True).run_dir
    assert len(seen) == 6 and ranks[0].shape == (6, 2, 16)
    for step, whole in enumerate(seen):  # rank r trains on rows 2r, 2r + 1 of one process's batch
        assert torch.equal(torch.cat([ranks[0][step], ranks[1][step]]), whole)
    rows = [{tuple(w.tolist()) for w in r.flatten(0, 1)} for r in ranks]
    assert len(rows[0]) == len(rows[1]) == 12 and not rows[0] & rows[1]  # no window read by both processes
    assert_same_weights(weights(runs / "ddp-prepared"), weights(single))
