"""Shared test fixtures: deterministic seeds, a private data cache, and the real corpora in ../shared/data."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from qkv.models import GPT, GPTConfig
from tests.finetune_models import tiny_gpt2_dir, tiny_llama_dir  # noqa: F401  (session fixtures: tiny bases)
from tests.gguf_files import bpe, smollm2, smollm2_hf, smollm2_hf_tokenizer, smollm2_qkv  # noqa: F401  (fixtures)
from tests.gguf_parses import share_gguf_parses
from tests.smol import smol_bundle, smol_hf, smol_hf_dir  # noqa: F401  (session fixtures: SmolLM2's tokenizer)

share_gguf_parses()  # transformers' GGUF loader parses each file once per process, not three times

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules that hold a test marked ``slow`` first, each in its own order: the parallel workers (a module to a
    worker) start the long ones early and finish together on the short ones, instead of one worker running a long
    module at the end while the other waits (about a minute of the suite's time on 2 cores). The same order on
    every worker, as pytest-xdist requires."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable: otherwise as collected


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _malloc_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training sessions started in this process leave glibc's malloc as it is: one process runs thousands of tests,
    and kept memory would hold every test's peak (tests/training/test_allocator.py checks the setting, each case in a
    process of its own)."""
    monkeypatch.setenv("QKV_KEEP_FREED_MEMORY", "0")


@pytest.fixture(scope="session")
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This session's cache; its ``native`` folder (the built C library, a minute of compiling) is shared by the
    parallel workers of one run, which build it once (qkv.native locks the build)."""
    cache = tmp_path_factory.mktemp("qkv-cache")
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "qkv-native"
    shared.mkdir(exist_ok=True)
    try:
        (cache / "native").symlink_to(shared, target_is_directory=True)
    except OSError:  # no symlinks here: each worker builds its own
        pass
    return cache


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


@pytest.fixture
def checked_drafts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of drafted tokens of each call of the engine's ``checked_step`` (prompt lookup's verifying
    forward), appended as the test runs: empty while no draft was checked."""
    from qkv.decoding import engine

    drafts: list[int] = []
    real = engine.checked_step
    monkeypatch.setattr(engine, "checked_step", lambda *args: drafts.append(len(args[1])) or real(*args))
    return drafts


def tiny_gpt(
    *,
    vocab_size: int = 50,
    context_length: int = 40,
    d_model: int = 32,
    n_heads: int = 4,
    n_layers: int = 2,
    seed: int | None = 1,
    dtype: torch.dtype = torch.float64,
    init_std: float | None = 0.5,
    **variant,
) -> GPT:
    """A tiny random GPT in eval mode, the one the decoding, model and optimizer tests share. float64 by default:
    cached and uncached paths add the same numbers in different orders, and in float32 a near-tie between two
    logits could flip an argmax. init_std=0.5 gives varied logits, so greedy text does not repeat one token;
    ``seed`` None keeps the current random state."""
    if seed is not None:
        torch.manual_seed(seed)
    settings = dict(
        vocab_size=vocab_size,
        d_model=d_model,
        n_heads=n_heads,
        n_layers=n_layers,
        context_length=context_length,
        **({} if init_std is None else {"init_std": init_std}),
        **variant,
    )
    return GPT(GPTConfig(**settings)).to(dtype).eval()  # fmt: skip
