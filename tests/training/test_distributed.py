"""Two CPU processes under torchrun (DDP, gloo) train the same model as one process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from qkv.training.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

TEXT = "the quick brown fox jumps over the lazy dog. " * 200


def run_qkv(args: list[str], *, nproc: int | None = None) -> subprocess.CompletedProcess:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
        if nproc
        else [sys.executable, "-m"]
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(launcher + ["qkv", *args], capture_output=True, text=True, env=env, timeout=300)


def test_two_processes_equal_one_process_with_the_same_global_batch(tmp_path) -> None:
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    common = [
        "train",
        "--data",
        str(data),
        "--preset",
        "gpt-nano",
        "--steps",
        "6",
        "--warmup-steps",
        "1",
        "--eval-interval",
        "3",
        "--eval-batches",
        "1",
        "--context-length",
        "16",
        "--dropout",
        "0",
        "--quiet",
        "--no-samples",
        "--threads",
        "1",
        "--device",
        "cpu",  # two CPU processes (gloo), whatever GPUs the machine has
    ]
    single = run_qkv(common + ["--batch-size", "4", "--out-dir", str(tmp_path / "one")])
    assert single.returncode == 0, single.stderr
    double = run_qkv(common + ["--batch-size", "2", "--out-dir", str(tmp_path / "two")], nproc=2)
    assert double.returncode == 0, double.stderr
    a = load_file(str(latest_checkpoint(tmp_path / "one") / "model.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "two") / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
