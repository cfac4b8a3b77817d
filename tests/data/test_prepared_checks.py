"""The cheap checks of a prepared folder (each shard's largest id against the vocabulary, the tokenizer's
sha256 on every load) and the bounds on sizes: Word2Vec's window, negatives and batch memory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.data.prepare import prepare
from qkv.data.shards import MANIFEST_FILE, TOKENIZER_FILE, TokenShards
from qkv.data.word2vec import MAX_NEGATIVE, MAX_WINDOW, Word2VecBatches, batch_bytes, window_pairs
from qkv.errors import QkvError
from qkv.tokenizers import train_tokenizer

TEXT = "the cat sat on the mat. " * 50


@pytest.fixture
def corpus(tmp_path: Path) -> str:
    (tmp_path / "cat.txt").write_text(TEXT)
    return str(tmp_path / "cat.txt")


@pytest.fixture
def folder(tmp_path: Path, corpus: str) -> Path:
    return prepare(corpus, tmp_path / "prepared", quiet=True).folder


def test_the_manifest_records_each_shards_largest_id(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    ids = TokenShards(folder)[0 : manifest["tokens"]]
    assert [s["max_id"] for s in manifest["shards"]] == [int(ids.max())]


def test_a_swapped_tokenizer_is_refused_on_every_load(folder: Path, corpus: str) -> None:
    train_tokenizer("char", TEXT + "!").save(folder / TOKENIZER_FILE)
    for load in (lambda: TokenShards(folder).tokenizer(), lambda: TokenShards(folder).verify()):
        with pytest.raises(QkvError, match="is not the tokenizer the shards were encoded with"):
            load()
    with pytest.raises(QkvError, match="is not the tokenizer the shards were encoded with"):
        prepare(corpus, folder, quiet=True)  # reusing the folder checks it too


def test_an_id_past_the_vocabulary_is_named_on_open_and_in_a_batch(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    vocab = manifest["tokenizer"]["vocab_size"]
    manifest["shards"][0]["max_id"] = vocab
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(QkvError, match=f"holds token id {vocab}, beyond the tokenizer's {vocab} entries"):
        TokenShards(folder)
    manifest["shards"][0]["max_id"] = vocab - 1  # the manifest is right, but the bytes changed since
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    shard = folder / manifest["shards"][0]["file"]
    ids = np.fromfile(shard, dtype=manifest["dtype"])
    ids[3] = vocab + 2
    ids.tofile(shard)
    shards = TokenShards(folder)
    assert shards.windows(torch.tensor([10]), 5).shape == (1, 5)  # a window without the changed id
    with pytest.raises(QkvError, match=f"a shard of {folder} holds token id {vocab + 2}"):
        shards.windows(torch.tensor([0]), 5)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"window": MAX_WINDOW + 1}, "--window must be a whole number from 1 to 1,000"),
        ({"window": 0}, "--window must be a whole number from 1 to 1,000"),
        ({"negative": 10**8}, "--negative must be a whole number from 1 to 1,000"),
        ({"window": MAX_WINDOW, "negative": MAX_NEGATIVE, "batch_words": 10**8}, "more than a quarter of the"),
    ],
)
def test_word2vec_sizes_are_bounded(settings: dict, message: str) -> None:
    stream, counts = np.array([4, 5, 4, 5, 2]), np.array([0, 0, 0, 0, 2, 2])
    with pytest.raises(QkvError, match=message):
        Word2VecBatches(stream, counts, separator=2, **settings)


def test_batch_memory_grows_with_window_negatives_and_words() -> None:
    small = batch_bytes(5, 5, 1_000)
    assert batch_bytes(10, 5, 1_000) > small and batch_bytes(5, 50, 1_000) > small
    assert batch_bytes(5, 5, 2_000) == 2 * small
    assert batch_bytes(5, 50, 1_000, arch="cbow") < batch_bytes(5, 50, 1_000)  # a CBOW row per word


def test_a_window_wider_than_the_sentence_pairs_every_word_once() -> None:
    centre, context = window_pairs(np.zeros(4, dtype=np.int64), np.full(4, 10**9))  # loops 3 offsets, not 10^9
    assert len(centre) == 4 * 3 and set(zip(centre.tolist(), context.tolist(), strict=True)) == {
        (i, j) for i in range(4) for j in range(4) if i != j
    }
