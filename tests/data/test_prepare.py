"""prepare(): the shards equal one encoding of the whole text for every input format and tokenizer, the
process pool gives the same ids, the tokenizer learns from a sample spread over the corpus, and a failure
(full disk, Ctrl-C, bad input) leaves nothing behind."""

from __future__ import annotations

import errno
import gzip
import json
import string
from pathlib import Path

import pytest

from qkv.data import builtin_corpus
from qkv.data import pieces as pieces_module
from qkv.data import prepare as prepare_module
from qkv.data import shards as shards_module
from qkv.data.prepare import prepare
from qkv.data.progress import size_text
from qkv.data.shards import MANIFEST_FILE, TOKENIZER_FILE, TokenShards
from qkv.data.sources import open_source
from qkv.errors import QkvError
from qkv.tokenizers import load_tokenizer, train_tokenizer

zstandard = pytest.importorskip("zstandard")
TEXT = "".join(f"Line {i}: the cat sat on the mat; naïve café {i * 7}.\n" for i in range(400))


def inputs(root: Path) -> dict[str, str]:
    """One corpus in every format, each holding documents whose text joins to a known string."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "book.txt").write_text(TEXT, encoding="utf-8")
    (root / "book.txt.gz").write_bytes(gzip.compress(TEXT.encode()))
    lines = TEXT.splitlines(keepends=True)
    docs = ["".join(lines[i : i + 50]) for i in range(0, len(lines), 50)]
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    (root / "docs.jsonl.zst").write_bytes(zstandard.compress(jsonl))
    (root / "folder").mkdir(exist_ok=True)
    for i, doc in enumerate(docs):
        (root / "folder" / f"{i:02d}.txt").write_text(doc, encoding="utf-8")
    found = {"txt": str(root / "book.txt"), "gz": str(root / "book.txt.gz"), "jsonl.zst": str(root / "docs.jsonl.zst")}
    found["folder"] = str(root / "folder")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": docs}), root / "docs.parquet", row_group_size=3)
        found["parquet"] = str(root / "docs.parquet")
    except ImportError:
        pass
    return found


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_shards_equal_the_one_shot_encoding_for_every_format(tmp_path: Path, kind: str) -> None:
    for name, data in inputs(tmp_path / "in").items():
        result = prepare(
            data, tmp_path / f"{kind}-{name}", tokenizer=kind, vocab_size=300 if kind == "bpe" else None, quiet=True
        )
        text = open_source(data).read_text()
        tokenizer = train_tokenizer(kind, text, 300 if kind == "bpe" else None)
        assert result.tokenizer() == tokenizer, name  # the sample is the whole (small) corpus
        shards = result.shards()
        assert shards[0 : len(shards)].tolist() == tokenizer.encode(text), name
        m = result.manifest
        assert m["tokens"] == len(shards) and m["source"]["characters"] == len(text)
        assert m["split"] == {
            "val_fraction": 0.1,
            "train_tokens": int(len(shards) * 0.9),
            "val_tokens": len(shards) - int(len(shards) * 0.9),
        }
        TokenShards(result.folder).verify()


@pytest.mark.parametrize("kind", ["char", "word"])
def test_the_process_pool_gives_the_same_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    monkeypatch.setattr(pieces_module, "PIECE_CHARS", 2_000)  # many pieces, several in flight
    pools = []

    class CountedPool(prepare_module.ProcessPoolExecutor):
        def __init__(self, *args, **kwargs) -> None:
            pools.append(args)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(prepare_module, "ProcessPoolExecutor", CountedPool)
    monkeypatch.setattr(prepare_module, "MIN_SHARD_TOKENS", 1_000)  # several shards of a small text
    path = tmp_path / "book.txt"
    path.write_text(TEXT * 3, encoding="utf-8")
    pooled = prepare(str(path), tmp_path / "pool", tokenizer=kind, workers=2, shard_tokens=5_000, quiet=True)
    single = prepare(str(path), tmp_path / "one", tokenizer=kind, workers=1, shard_tokens=5_000, quiet=True)
    assert len(pools) == 1 and pools[0][0] == 2  # the pool of two ran once; the single run used none
    assert len(pooled.manifest["shards"]) > 3
    assert pooled.manifest["shards"] == single.manifest["shards"]  # same ids, same checksums
    assert pooled.shards()[0 : pooled.manifest["tokens"]].tolist() == pooled.tokenizer().encode(TEXT * 3)


def test_the_tokenizer_trains_on_a_sample_spread_over_the_corpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pieces_module, "PIECE_CHARS", 500)
    folder = tmp_path / "letters"
    folder.mkdir()
    for i, letter in enumerate(string.ascii_letters):  # file i holds only letter i: where a sample comes from
        (folder / f"{i:02d}.txt").write_text((letter * 99 + "\n") * 3, encoding="utf-8")  # 300 bytes each
    seen: list[str] = []

    def spy(kind, texts, vocab_size=None):
        return train_tokenizer(kind, (seen.append(t) or t for t in texts), vocab_size)

    monkeypatch.setattr(prepare_module, "train_tokenizer", spy)
    result = prepare(str(folder), tmp_path / "out", tokenizer="char", sample_mb=0.0039, quiet=True)  # a quarter
    sampled = "".join(seen)
    assert 3_900 <= len(sampled) == result.manifest["tokenizer"]["sample_bytes"] <= 3_900 + 600
    for quarter in (string.ascii_letters[i : i + 13] for i in range(0, 52, 13)):  # from every part of the corpus
        assert 400 < sum(sampled.count(c) for c in quarter) < 1_700, quarter  # about evenly
    vocab = set(result.tokenizer().vocab[4:])
    assert vocab == set(sampled) and len(vocab) < 40  # letters of unsampled files are not in the vocabulary
    ids = result.shards()[0 : result.manifest["tokens"]]
    assert len(ids) == 52 * 300 + 51 * 2 and int((ids == 3).sum()) > 0  # yet every file is encoded (<unk>)


def test_a_given_tokenizer_is_used_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    tokenizer = train_tokenizer("word", "the cat sat on a different mat")
    result = prepare(str(path), tmp_path / "out", tokenizer=tokenizer, quiet=True)
    assert load_tokenizer(result.folder / TOKENIZER_FILE) == tokenizer
    assert result.shards()[0:20].tolist() == tokenizer.encode(TEXT)[:20]
    with pytest.raises(QkvError, match="--vocab-size trains a new tokenizer"):
        prepare(str(path), tmp_path / "x", tokenizer=tokenizer, vocab_size=50, quiet=True)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".") or p.name == "out")


def test_a_full_disk_leaves_nothing_half_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pieces_module, "PIECE_CHARS", 1_000)
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    calls = []

    def full_disk(file, data) -> None:
        calls.append(len(data))
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        file.write(data)

    monkeypatch.setattr(shards_module, "write_bytes", full_disk)
    with pytest.raises(
        QkvError, match="the disk filled up while writing the prepared data for .*out; nothing was kept"
    ):
        prepare(str(path), tmp_path / "out", quiet=True)
    assert leftovers(tmp_path) == []


def test_ctrl_c_and_bad_input_leave_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(shards_module, "write_bytes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(str(path), tmp_path / "out", quiet=True)
    assert leftovers(tmp_path) == []
    monkeypatch.undo()
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(gzip.compress(TEXT.encode() * 20)[:-100])
    with pytest.raises(QkvError, match="is truncated"):
        prepare(str(cut), tmp_path / "out", quiet=True)
    assert leftovers(tmp_path) == []
    assert not (tmp_path / "out" / MANIFEST_FILE).exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tokenizer": "sentencepiece"}, "--tokenizer 'sentencepiece' is unknown"),
        ({"tokenizer": "char", "vocab_size": 10}, "--vocab-size applies to word and bpe"),
        ({"sample_mb": 0}, "--tokenizer-sample must be above 0"),
        ({"workers": 0}, "--workers must be at least 1"),
        ({"shard_tokens": 0}, "--shard-tokens must be at least 1,000,000"),
        ({"shard_tokens": 1}, "--shard-tokens must be at least 1,000,000"),
        ({"tokenizer": "bpe", "vocab_size": 10**9}, "--vocab-size must be between 1 and 1,048,576"),
    ],
)
def test_bad_settings(tmp_path: Path, settings: dict, message: str) -> None:
    with pytest.raises(QkvError, match=message):
        prepare(None, tmp_path / "out", quiet=True, **settings)


def test_progress_lines_without_a_terminal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prepare(None, tmp_path / "out", quiet=False)
    err = capsys.readouterr().err
    text = builtin_corpus()
    size = train_tokenizer("char", text).vocab_size
    assert f"tokenizer: char, {size} entries, trained on {size_text(len(text.encode()))} of text" in err
    assert f"into {len(text):,} tokens in" in err and "MB/s" in err and "tokens/s" in err
