"""The --out folder of a preparation: this very preparation is reused, anything else refused; the finished
folder takes ``out``'s place, or another process's identical result is taken; a failed write says what to fix."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from qkv.data import prepare as prepare_module
from qkv.data.prepare import prepare
from qkv.data.prepared_folder import existing, publish, write_error
from qkv.errors import QkvError

TEXT = "".join(f"Line {i}: the cat sat on the mat; naïve café {i * 7}.\n" for i in range(400))


def test_a_finished_folder_is_reused_and_a_different_one_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    first = prepare(str(path), tmp_path / "out", quiet=True)
    assert not first.reused
    monkeypatch.setattr(prepare_module, "_encode", lambda *a, **k: pytest.fail("encoded again"))
    assert prepare(str(path), tmp_path / "out", quiet=True).reused
    with pytest.raises(QkvError, match=r"already holds a different preparation \(a with the char tokenizer\)"):
        prepare(str(path), tmp_path / "out", tokenizer="word", quiet=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(QkvError, match="is not empty and holds no prepared data"):
        prepare(str(path), tmp_path / "other", quiet=True)
    (tmp_path / "empty").mkdir()
    monkeypatch.undo()
    assert prepare(str(path), tmp_path / "empty", quiet=True).manifest["tokens"] == len(TEXT)


def test_a_file_is_refused_and_another_process_identical_result_taken(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text(TEXT, encoding="utf-8")
    (tmp_path / "file").write_text("mine")
    with pytest.raises(QkvError, match="is a file: give a folder"):
        existing(tmp_path / "file", {})
    assert existing(tmp_path / "free", {}) is None
    first = prepare(str(path), tmp_path / "out", quiet=True)
    second = prepare(str(path), tmp_path / "work", quiet=True)  # as if a second process had prepared it too
    taken = publish(second.folder, first.folder, first.manifest["recipe"])
    assert taken.reused and taken.folder == first.folder and (tmp_path / "work").is_dir()
    with pytest.raises(QkvError, match="already holds a different preparation"):
        publish(second.folder, first.folder, {"another": "recipe"})


def test_a_failed_write_names_the_fix(tmp_path: Path) -> None:
    full = write_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "out", tmp_path / ".work")
    assert "the disk filled up" in str(full) and "nothing was kept" in str(full)
    denied = write_error(OSError(errno.EACCES, "Permission denied", str(tmp_path / "x")), tmp_path / "out", tmp_path)
    assert str(denied).startswith(f"cannot write {tmp_path / 'x'} (Permission denied); nothing was kept")
