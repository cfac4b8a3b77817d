"""open_source(): every input kind streams the same text that reading it whole gives, and bad input is one
clear sentence naming the file (and the line) and the fix."""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import re
from pathlib import Path

import pytest

from qkv.data import builtin_corpus
from qkv.data.readers import BLOCK_BYTES
from qkv.data.sources import SEPARATOR, open_source
from qkv.errors import QkvError

zstandard = pytest.importorskip("zstandard")

DOCS = ["The first document.\nIt has two lines.", "Zweites Dokument: café, naïve, 日本語.", "  third, with spaces  \n"]
JOINED = SEPARATOR.join(DOCS)
COMPRESSORS = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress, ".zst": zstandard.compress}


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def jsonl(docs: list[str], field: str = "text") -> bytes:
    return "".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)).encode()


def test_builtin_streams_the_builtin_corpus() -> None:
    source = open_source(None)
    assert source.read_text() == builtin_corpus() and source.name == "pydoc"
    assert source.text_bound == len(builtin_corpus().encode())


def test_text_file_in_blocks_equals_the_file(tmp_path: Path) -> None:
    text = ("ascii line\n" + "ünïcödé 日本 " * 50 + "\n") * (3 * BLOCK_BYTES // 1000)  # many blocks, split chars
    path = write(tmp_path / "big.txt", b"\xef\xbb\xbf" + text.encode())  # a byte-order mark is dropped
    source = open_source(str(path))
    blocks = list(source.blocks())
    assert len(blocks) > 3 and "".join(b for b, _ in blocks) == text
    assert blocks[-1][1] == path.stat().st_size == source.total_bytes  # positions reach the file size


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_compressed_text_and_jsonl(tmp_path: Path, suffix: str) -> None:
    text_file = write(tmp_path / f"book.txt{suffix}", COMPRESSORS[suffix](DOCS[0].encode()))
    assert open_source(text_file).read_text() == DOCS[0]
    assert open_source(text_file).name == "book"
    lines = write(tmp_path / f"docs.jsonl{suffix}", COMPRESSORS[suffix](jsonl(DOCS)))
    assert open_source(lines).read_text() == JOINED


def test_multi_frame_zstd(tmp_path: Path) -> None:
    path = write(tmp_path / "two.txt.zst", zstandard.compress(b"first half ") + zstandard.compress(b"second half"))
    assert open_source(path).read_text() == "first half second half"


def test_jsonl_skips_blank_lines_and_empty_texts_and_uses_the_field(tmp_path: Path) -> None:
    data = jsonl(DOCS[:1], "body") + b"\n" + b'{"body": ""}\n{"body": null}\n' + jsonl(DOCS[1:], "body")
    path = write(tmp_path / "a.ndjson", data)
    assert open_source(path, text_field="body").read_text() == JOINED


def test_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 4], "content": [DOCS[0], None, DOCS[1], DOCS[2]]}), path, row_group_size=2)
    assert open_source(path, text_field="content").read_text() == JOINED
    with pytest.raises(QkvError, match=r"has no column 'text' \(its columns: 'id', 'content'\): name the text"):
        open_source(path).read_text()


def test_folder_glob_and_several_paths(tmp_path: Path) -> None:
    write(tmp_path / "c" / "1.txt", DOCS[0].encode())
    write(tmp_path / "c" / "2.jsonl.gz", gzip.compress(jsonl(DOCS[1:2])))
    write(tmp_path / "c" / "sub" / "3.txt.xz", lzma.compress(DOCS[2].encode()))
    write(tmp_path / "c" / "notes.md", b"not a corpus")
    assert open_source(tmp_path / "c").read_text() == JOINED
    assert open_source(str(tmp_path / "c" / "**" / "*.txt*")).read_text() == DOCS[0] + SEPARATOR + DOCS[2]
    both = open_source([str(tmp_path / "c" / "sub"), str(tmp_path / "c" / "1.txt")])
    assert both.read_text() == DOCS[2] + SEPARATOR + DOCS[0]


def test_identity_changes_with_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", b"one")
    before = open_source(path).identity
    write(path, b"two!")
    assert open_source(path).identity != before


def test_hugging_face_dataset_folders(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": DOCS, "n": [1, 2, 3]}).save_to_disk(str(tmp_path / "saved"))
    assert open_source(f"hf:{tmp_path / 'saved'}").read_text() == JOINED
    write(tmp_path / "raw" / "train.jsonl", jsonl(DOCS, "body"))  # a folder of data files, as on the Hub
    source = open_source(f"hf:{tmp_path / 'raw'}@train", text_field="body")
    assert source.read_text() == JOINED and source.total_bytes is None
    with pytest.raises(QkvError, match=r"has no 'text' column \(its columns: .*'body'.*\): name the text column"):
        open_source(f"hf:{tmp_path / 'raw'}").read_text()


def test_hugging_face_offline_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("datasets")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # the libraries read these variables once, on import (an earlier test may have imported them): set what they
    # read, as a process started offline has it, or they retry the network for 20 s
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(QkvError, match=r"could not open the Hugging Face dataset 'nobody/no-such-set' .*hf:FOLDER"):
        open_source("hf:nobody/no-such-set").read_text()


# ------------------------------------------------------------------------------------------- bad input


def test_folder_without_text_and_glob_without_matches(tmp_path: Path) -> None:
    write(tmp_path / "empty" / "a.txt", b"  \n")
    write(tmp_path / "empty" / "b.jsonl", b'{"text": ""}\n')
    with pytest.raises(QkvError, match=re.escape(f"{tmp_path / 'empty'} holds no text (its 2 files are empty)")):
        open_source(tmp_path / "empty").read_text()
    with pytest.raises(QkvError, match=r"\*\.txt matches no files: check the pattern"):
        open_source(str(tmp_path / "nothing" / "*.txt"))


def test_jsonl_line_without_the_field_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path / "d.jsonl", jsonl(DOCS[:2]) + b'{"title": "x", "body": "y"}\n')
    with pytest.raises(
        QkvError, match=re.escape(f"{path} line 3 has no 'text' field (its fields: 'title', 'body'): name the text")
    ):
        open_source(path).read_text()
    write(path, b'{"text": "fine"}\n{"text": 3}\n')
    with pytest.raises(QkvError, match="line 2: 'text' holds a int, not a string"):
        open_source(path).read_text()
    write(path, b'{"text": "fine"}\n{"text": \n')
    with pytest.raises(QkvError, match="line 2 is not valid JSON"):
        open_source(path).read_text()


@pytest.mark.parametrize("suffix", list(COMPRESSORS))
def test_truncated_compressed_file(tmp_path: Path, suffix: str) -> None:
    whole = COMPRESSORS[suffix](("some text to compress " * 5000).encode())
    path = write(tmp_path / f"cut.txt{suffix}", whole[: len(whole) // 2])
    with pytest.raises(QkvError, match=re.escape(f"compressed file {path} is truncated")):
        open_source(path).read_text()
    jsonl_path = write(tmp_path / f"cut.jsonl{suffix}", COMPRESSORS[suffix](jsonl(DOCS * 500))[:-20])
    with pytest.raises(QkvError, match="is truncated"):
        open_source(jsonl_path).read_text()
    garbage = write(tmp_path / f"garbage.txt{suffix}", b"this is not compressed at all" * 10)
    with pytest.raises(QkvError, match=re.escape(f"compressed file {garbage} is damaged")):
        open_source(garbage).read_text()


def test_invalid_utf8_in_a_later_block_names_offset_and_line(tmp_path: Path) -> None:
    head = ("x" * 99 + "\n") * (BLOCK_BYTES // 100 + 5)  # the bad byte lies in the second block
    path = write(tmp_path / "late.txt", head.encode() + "café".encode("latin-1"))
    offset = len(head) + 3
    with pytest.raises(QkvError, match=rf"byte 0xe9 at offset {offset} \(line {head.count(chr(10)) + 1}\)"):
        open_source(path).read_text()


def test_binary_and_empty_single_files(tmp_path: Path) -> None:
    with pytest.raises(QkvError, match="holds binary data once decompressed"):
        open_source(write(tmp_path / "b.txt.gz", gzip.compress(b"\x00\x01binary"))).read_text()
    with pytest.raises(QkvError, match="e.txt is empty: give a file with text in it"):
        open_source(write(tmp_path / "e.txt", b"\n\n")).read_text()
    with pytest.raises(QkvError, match=r"j.jsonl has no text under 'text'"):
        open_source(write(tmp_path / "j.jsonl", b'{"text": "  "}\n')).read_text()
