"""The prepared cache: a corpus is tokenized once and found again by key; a changed file or other settings
get their own folder; a waiting process maps what the first one prepared; two torchrun processes reading a
cached corpus train the same model as one process reading the prepared folder."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from qkv.data import cache as cache_module
from qkv.data.cache import cache_root, prepared_for_training
from qkv.data.prepare import prepare
from qkv.tokenizers import train_tokenizer
from qkv.training.checkpoint import latest_checkpoint

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

TEXT = "the quick brown fox jumps over the lazy dog. " * 200


def corpus(tmp_path: Path, text: str = TEXT) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_corpus_is_prepared_once_and_found_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = corpus(tmp_path)
    first = prepared_for_training(str(path), quiet=True)
    assert not first.reused and first.folder.parent == cache_root() and first.folder.name.startswith("corpus-")
    monkeypatch.setattr(cache_module, "prepare", lambda *a, **k: pytest.fail("tokenized again"))
    again = prepared_for_training(str(path), quiet=True)
    assert again.reused and again.folder == first.folder
    monkeypatch.undo()
    other = prepared_for_training(str(path), kind="word", quiet=True)  # other settings: a folder of their own
    assert other.folder != first.folder and other.tokenizer().kind == "word"
    time.sleep(0.01)
    corpus(tmp_path, TEXT + "and one more sentence.")  # a changed file: prepared anew
    changed = prepared_for_training(str(path), quiet=True)
    assert changed.folder != first.folder and changed.manifest["tokens"] == len(TEXT) + 22


def test_a_prepared_folder_is_used_as_it_is(tmp_path: Path) -> None:
    folder = prepare(str(corpus(tmp_path)), tmp_path / "prepared", quiet=True).folder
    found = prepared_for_training(str(folder), kind="bpe")  # the folder's own tokenizer, whatever asked
    assert found.folder == folder and found.tokenizer().kind == "char"


def test_a_resume_without_its_cache_encodes_with_the_runs_tokenizer(tmp_path: Path) -> None:
    runs_tokenizer = train_tokenizer("char", TEXT + "XYZ")  # not what training on TEXT alone would give
    found = prepared_for_training(str(corpus(tmp_path)), tokenizer=runs_tokenizer, quiet=True)
    assert found.tokenizer() == runs_tokenizer
    assert found.shards()[0:10].tolist() == runs_tokenizer.encode(TEXT[:10])


def test_other_processes_wait_for_the_first_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_module, "WAIT_SECONDS", 0.05)
    path = str(corpus(tmp_path))
    results = {}

    def first_process() -> None:
        time.sleep(0.5)
        results[0] = prepared_for_training(path, local_rank=0, quiet=True)

    thread = threading.Thread(target=first_process)
    thread.start()
    results[1] = prepared_for_training(path, local_rank=1, quiet=True)  # returns once the manifest is there
    thread.join()
    assert results[1].folder == results[0].folder and not results[0].reused


def run_qkv(args: list[str], *, nproc: int | None = None) -> subprocess.CompletedProcess:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m"]
        if nproc
        else [
            sys.executable,
            "-m",
        ]
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(launcher + ["qkv", *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_two_processes_on_a_cached_corpus_equal_one_on_the_prepared_folder(tmp_path: Path) -> None:
    path = corpus(tmp_path)
    folder = prepare(str(path), tmp_path / "prepared", quiet=True).folder
    common = ["train", "--preset", "gpt-nano", "--steps", "6", "--warmup-steps", "1", "--eval-interval", "3"]
    common += ["--eval-batches", "1", "--context-length", "16", "--dropout", "0", "--quiet", "--no-samples"]
    common += ["--threads", "1", "--device", "cpu"]  # two CPU processes (gloo), whatever GPUs there are
    single = run_qkv([*common, "--data", str(folder), "--batch-size", "4", "--out-dir", str(tmp_path / "one")])
    assert single.returncode == 0, single.stderr
    # Rank 0 prepares the cache from the text file while rank 1 waits; then each reads its rows of a batch.
    double = run_qkv([*common, "--data", str(path), "--batch-size", "2", "--out-dir", str(tmp_path / "two")], nproc=2)
    assert double.returncode == 0, double.stderr
    assert len(list(cache_root().glob("corpus-*"))) >= 1
    a = load_file(str(latest_checkpoint(tmp_path / "one") / "model.safetensors"))
    b = load_file(str(latest_checkpoint(tmp_path / "two") / "model.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
