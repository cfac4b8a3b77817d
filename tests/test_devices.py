"""Naming a device: one GPU per process under torchrun, and one line when a machine has fewer GPUs than processes.

No GPU is needed: CUDA's answers (available, how many devices) are replaced, as a machine with one GPU gives them."""

from __future__ import annotations

import pytest
import torch

from qkv.devices import resolve_device
from qkv.errors import QkvError
from qkv.training import TrainConfig
from qkv.training import run as training_run


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.mark.parametrize("name", ["auto", "cuda"])
def test_each_local_process_gets_its_own_gpu(one_gpu, name) -> None:
    assert resolve_device(name, local_rank=0) == torch.device("cuda", 0)
    with pytest.raises(QkvError, match=r"1 CUDA GPU for 2 or more processes: .*--nproc_per_node=1.*--device cpu"):
        resolve_device(name, local_rank=1)
    with pytest.raises(QkvError, match=r"device='cpu'"):
        resolve_device(name, local_rank=1, flag="device=")
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")  # the CPU takes any number of processes


def test_too_many_processes_stop_before_joining_the_group(one_gpu, monkeypatch) -> None:
    """Under torchrun every process of the machine sees LOCAL_WORLD_SIZE, so all of them stop with the same line,
    rank 0 too (whose own GPU exists), before any waits for the others in init_process_group."""
    joined = []
    monkeypatch.setattr(training_run, "init_distributed", lambda backend: joined.append(backend))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(QkvError, match="--nproc_per_node=1"):
        training_run.start_session(TrainConfig(device="auto"))
    assert joined == []
