"""keep_freed_memory: after it, a freed tensor's pages serve the next one without page faults; without it (or with
QKV_KEEP_FREED_MEMORY=0) glibc hands large blocks back and the next allocation faults them in again. Each case runs
in its own process: malloc's settings are the process's."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")

PROGRAM = """
import resource, sys, torch
from qkv.training.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = torch.ones(40 << 18)  # 40 MB: above any mmap threshold of glibc's
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del block
print(kept, min(faults[1:]), max(faults[1:]), keep_freed_memory())
"""


def run(how: str, **env: str) -> list[str]:
    env = {**os.environ, "QKV_KEEP_FREED_MEMORY": "1", **env}  # the test session's own setting (conftest) aside
    done = subprocess.run([sys.executable, "-c", PROGRAM, how], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_kept_memory_is_reused_without_faults() -> None:
    """A freed block's pages serve a later one. Not always the very next: what the interpreter allocates meanwhile
    can leave the freed block split, and then the heap grows once more (8 runs here: every one reused the pages
    in most of its later allocations; four had one later allocation that faulted them in)."""
    kept, fewest, _, again = run("keep")
    assert kept == "True" and again == "True"
    assert int(fewest) < 100  # 40 MB is 10,240 pages


def test_by_default_malloc_gives_large_blocks_back_and_faults_them_in_again() -> None:
    kept, fewest, _, later = run("plain")
    assert kept == "None" and int(fewest) > 5000  # every allocation faults its pages in
    assert later == "True"  # asked only at the end: then it takes effect


def test_the_environment_variable_leaves_malloc_alone() -> None:
    kept, fewest, _, _ = run("keep", QKV_KEEP_FREED_MEMORY="0")
    assert kept == "False" and int(fewest) > 5000


def test_a_cpu_training_session_keeps_freed_memory(monkeypatch) -> None:
    from qkv.training import TrainConfig
    from qkv.training import run as training_run

    calls = []
    monkeypatch.setattr(training_run, "keep_freed_memory", lambda: calls.append(1))
    monkeypatch.setattr(training_run, "set_threads", lambda threads: None)  # leave this process's threads alone
    session = training_run.start_session(TrainConfig(device="cpu"))
    assert session.device.type == "cpu" and calls == [1]
