"""load_corpus(): what `--data` accepts, and the one-sentence errors for what it does not."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from qkv.data import KNOWN_CORPORA, Corpus, Source, builtin_corpus, load_corpus
from qkv.errors import QkvError
from tests.conftest import shared_corpus


@pytest.mark.parametrize("data", [None, "pydoc", "builtin"])
def test_builtin_names(data: str | None) -> None:
    corpus = load_corpus(data)
    assert corpus.text == builtin_corpus()
    assert corpus.name == "pydoc"
    assert "pydoc_data.topics" in corpus.source


@pytest.mark.parametrize("as_path", [True, False])
def test_text_file(tmp_path: Path, as_path: bool) -> None:
    path = tmp_path / "fables.txt"
    path.write_text("The fox jumps.\nÜber alles: café.\n", encoding="utf-8")
    corpus = load_corpus(path if as_path else str(path))
    assert corpus == Corpus(text="The fox jumps.\nÜber alles: café.\n", name="fables", source=str(path))
    assert "chars=" in repr(corpus) and "fox" not in repr(corpus)  # a 1 MB text never floods a log


def test_folder_reads_txt_files_recursively_in_path_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "c.txt").write_text("C", encoding="utf-8")
    (tmp_path / "a.txt").write_text("A", encoding="utf-8")
    (tmp_path / "sub" / "b.txt").write_text("B", encoding="utf-8")
    (tmp_path / "notes.md").write_text("not a corpus", encoding="utf-8")
    corpus = load_corpus(tmp_path)
    assert corpus.text == "A\n\nC\n\nB"  # a.txt, c.txt, sub/b.txt
    assert corpus.name == tmp_path.name


def test_folder_without_txt_files(tmp_path: Path) -> None:
    (tmp_path / "readme.md").write_text("hello", encoding="utf-8")
    with pytest.raises(QkvError, match=re.escape(f"folder {tmp_path} has no .txt files in it")):
        load_corpus(tmp_path)


def test_folder_leaves_out_empty_files_but_not_a_folder_of_only_empty_ones(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("A", encoding="utf-8")
    (tmp_path / "b.txt").write_text(" \n", encoding="utf-8")
    (tmp_path / "c.txt").write_text("C", encoding="utf-8")
    assert load_corpus(tmp_path).text == "A\n\nC"  # no blank document between A and C
    (tmp_path / "a.txt").write_text("", encoding="utf-8")
    (tmp_path / "c.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(QkvError, match=re.escape(f"{tmp_path} holds no text (its 3 files are empty)")):
        load_corpus(tmp_path)


def test_missing_path_lists_the_choices(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(QkvError) as caught:
        load_corpus(missing)
    assert str(caught.value) == (
        f"{missing} does not exist: give a text file, a folder of .txt files, a glob, a .jsonl or .parquet "
        "file, hf:DATASET, or one of: pydoc (built in), tinyshakespeare"
    )


def test_empty_file(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    with pytest.raises(QkvError, match="empty.txt is empty: give a file with text in it"):
        load_corpus(tmp_path / "empty.txt")


def test_binary_file(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\x89PNG\x00\x00\x01\x02")
    with pytest.raises(QkvError, match="model.bin looks binary"):
        load_corpus(tmp_path / "model.bin")


def test_latin1_file_names_the_byte(tmp_path: Path) -> None:
    (tmp_path / "latin.txt").write_bytes("line one\ncafé\n".encode("latin-1"))
    with pytest.raises(QkvError, match=r"latin.txt is not valid UTF-8: byte 0xe9 at offset 12 \(line 2\)"):
        load_corpus(tmp_path / "latin.txt")


def test_known_name_is_fetched_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    origin = tmp_path / "server.txt"
    origin.write_text("To be, or not to be.\n", encoding="utf-8")
    digest = hashlib.sha256(origin.read_bytes()).hexdigest()
    monkeypatch.setitem(KNOWN_CORPORA, "tinyshakespeare", Source(origin.as_uri(), digest, "ts.txt"))
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    corpus = load_corpus("tinyshakespeare")
    assert corpus.text == "To be, or not to be.\n"
    assert corpus.name == "tinyshakespeare"
    assert origin.as_uri() in corpus.source and str(tmp_path / "cache" / "ts.txt") in corpus.source


def test_known_name_without_network_gives_the_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gone = (tmp_path / "gone.txt").as_uri()
    monkeypatch.setitem(KNOWN_CORPORA, "tinyshakespeare", Source(gone, "0" * 64, "ts.txt"))
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        QkvError, match=f"could not download tinyshakespeare from {re.escape(gone)} .*pass --data /path/to/file"
    ):
        load_corpus("tinyshakespeare")


def test_shared_tinyshakespeare() -> None:
    folder = shared_corpus("tinyshakespeare")
    assert len(load_corpus(folder / "input.txt").text) == 1_115_394
    assert len(load_corpus(folder).text) == 1_115_394  # the folder holds one .txt file
