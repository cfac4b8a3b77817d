"""Where training runs: batches moved to the device without making the host wait for a GPU; how many CPU threads."""

from __future__ import annotations

import os

import pytest
import torch

from qkv.training.device import to_device


def test_on_the_cpu_a_batch_is_the_same_tensor() -> None:
    batch = torch.arange(12).view(3, 4)
    assert to_device(batch, torch.device("cpu")) is batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_batch_reaches_the_gpu_through_pinned_memory_unchanged() -> None:
    batch = torch.randint(0, 100, (8, 64))
    moved = to_device(batch, torch.device("cuda", 0))
    assert moved.is_cuda and torch.equal(moved.cpu(), batch)


@pytest.mark.parametrize(
    ("cores", "busy", "threads"),
    [
        (2, 0.0, 2),  # a quiet machine: every core
        (2, 1.0, 1),  # one CPU-bound process beside (issue 23: 2 threads ran 2.5x slower than 1)
        (2, 0.3, 2),  # a light background load does not cost a thread
        (2, 2.7, 1),  # everything busy: still one
        (8, 3.0, 5),
        (8, None, 8),  # unknown: all cores
        (1, 0.0, 1),
    ],
)
def test_the_default_threads_are_the_idle_cores(cores, busy, threads) -> None:
    from qkv.training.device import default_threads

    assert default_threads(cores, busy) == threads


def test_the_default_lowers_the_threads_with_a_note(monkeypatch, capsys) -> None:
    import qkv.training.device as device

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(device, "usable_cores", lambda: 2)
    monkeypatch.setattr(device, "busy_cores", lambda: 1.0)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        device.set_threads(None)
        assert torch.get_num_threads() == 1
        assert "note: other processes keep 1.0 of the 2 cores busy: using 1 thread" in capsys.readouterr().err
        device.set_threads(None)  # never raises the count a caller set
        monkeypatch.setattr(device, "busy_cores", lambda: 0.0)
        device.set_threads(None)
        assert torch.get_num_threads() == 1 and capsys.readouterr().err == ""
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own choice stands
        torch.set_num_threads(2)
        monkeypatch.setattr(device, "busy_cores", lambda: 1.0)
        device.set_threads(None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_busy_cores_reads_a_number_or_none() -> None:
    from qkv.training.device import busy_cores

    busy = busy_cores(0.01)
    assert busy is None or 0.0 <= busy <= (os.cpu_count() or 1) + 0.5
