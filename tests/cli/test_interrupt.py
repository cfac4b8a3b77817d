"""Ctrl-C during `qkv train` saves a checkpoint and exits cleanly; `--resume` then finishes the run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from qkv.training.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


def test_ctrl_c_saves_a_checkpoint_and_resume_finishes(tmp_path) -> None:
    data = tmp_path / "text.txt"
    data.write_text("an interrupted run must lose nothing that was finished.\n" * 80)
    run = tmp_path / "run"
    args = [
        sys.executable,
        "-m",
        "qkv",
        "train",
        "--data",
        str(data),
        "--out-dir",
        str(run),
        "--preset",
        "gpt-nano",
        "--steps",
        "100000",
        "--warmup-steps",
        "5",
        "--eval-interval",
        "100000",
        "--log-interval",
        "1",
        "--no-samples",
        "--threads",
        "1",
    ]
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    deadline = time.time() + 120
    for line in process.stderr:  # wait until training is under way
        if line.startswith("step 20/") or time.time() > deadline:
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "Traceback" not in err and "interrupted at step" in err
    checkpoint = latest_checkpoint(run)
    stopped_at = json.loads((checkpoint / "trainer_state.json").read_text())["step"]
    assert stopped_at >= 20

    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "qkv",
            "train",
            "--resume",
            str(run),
            "--steps",
            str(stopped_at + 5),
            "--quiet",
            "--no-samples",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    final = json.loads((latest_checkpoint(run) / "trainer_state.json").read_text())
    assert final["step"] == stopped_at + 5
