"""Shared test fixtures: deterministic seeds and the location of the real corpora in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def shared_corpus(name: str) -> Path:
    """Path of a corpus in ../shared/data, or skip the test when that folder is absent."""
    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"{path} is absent (the real corpora live in ../shared/data beside the checkout)")
    return path


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tiny recurrent models on one CPU thread, then restore the thread count: their step-by-step
    ops are too small to split, so a second thread only adds synchronisation (a lot of it on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
