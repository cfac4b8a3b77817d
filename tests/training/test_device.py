"""Where training runs: batches moved to the device without making the host wait for a GPU."""

from __future__ import annotations

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
