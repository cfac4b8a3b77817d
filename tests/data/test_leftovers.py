"""What a killed preparation leaves: its work folder is removed by the next preparation once its process is
gone (a live one's folder is kept), and its pool workers die with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from qkv.data.leftovers import OWNER_FILE, make_work_folder, remove_stale_work_folders

pytest.importorskip("fcntl")


def test_only_folders_of_gone_processes_are_removed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    live, owner = make_work_folder(out)  # held by this (live) process
    gone = tmp_path / ".out.preparing-4194305-00000000"  # above any pid_max: no such process
    gone.mkdir()
    (gone / OWNER_FILE).write_text("4194305\n")
    old = tmp_path / ".out.preparing-1a2b3c4d"  # an older qkv's name: no pid, no lock
    old.mkdir()
    other = tmp_path / ".other.preparing-4194305-00000000"  # beside another output: not ours to judge
    other.mkdir()
    assert set(remove_stale_work_folders(out)) == {gone, old}
    assert live.is_dir() and other.is_dir() and not gone.exists() and not old.exists()
    owner.close()  # the lock is released as when the process ends
    assert remove_stale_work_folders(out) == [live]


def test_a_folder_being_made_by_a_live_process_is_kept(tmp_path: Path) -> None:
    making = tmp_path / f".out.preparing-{os.getpid()}-00000000"  # no lock file yet
    making.mkdir()
    assert remove_stale_work_folders(tmp_path / "out") == [] and making.is_dir()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_parent(tmp_path: Path) -> None:
    """A parent forks a worker that calls die_with_parent, then the parent is killed with SIGKILL."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from qkv.data.leftovers import die_with_parent
        parent = os.getpid()
        child = os.fork()
        if child == 0:
            die_with_parent(parent)
            print(os.getpid(), flush=True)
            time.sleep(600)
            os._exit(0)
        time.sleep(600)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    with parent.stdout:
        worker = int(parent.stdout.readline())
        assert _running(worker)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    for _ in range(1000):  # the kernel kills the worker as the parent exits: poll until it is gone
        if not _running(worker):
            return
        time.sleep(0.01)
    os.kill(worker, signal.SIGKILL)
    pytest.fail(f"worker {worker} outlived its parent")


def _running(pid: int) -> bool:
    """True while ``pid`` runs (a killed process waiting to be reaped, a zombie, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
