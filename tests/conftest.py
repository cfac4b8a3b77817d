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
