"""Shared test fixtures: deterministic seeds, a private data cache, and the real corpora in ../shared/data."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qkv-cache")


@pytest.fixture(autouse=True)
def _private_cache(_session_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Downloads and prepared corpora go to a folder of this test session, never to ~/.cache."""
    monkeypatch.setenv("QKV_CACHE", str(_session_cache))


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
