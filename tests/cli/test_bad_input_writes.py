"""An output that cannot be written (a path under a file, a full disk) is one line naming the path and the fix,
exit code 2, in every verb that writes a file: they all write through qkv.io.writing."""

from __future__ import annotations

import errno
import importlib.util
import os

import pytest

from tests.cli.test_bad_input import assert_one_line_error, run_cli

# verb, its arguments after RUN_DIR with {out} where the output goes, the output's name
WRITERS = [
    ("quantize", ["--out", "{out}"], "copy"),
    ("export", ["--onnx", "{out}"], "model.onnx"),
    ("lens", ["hello world", "--out", "{out}"], "lens.png"),
    ("attribute", ["hello world", "--out", "{out}"], "attribute.png"),
    (
        "patch",
        ["--clean", "hello world", "--corrupt", "small world", "--token", "h", "--foil", "w", "--out", "{out}"],
        "patch.png",
    ),
    ("heads", ["--length", "4", "--batch", "1", "--out", "{out}"], "heads.png"),
    ("embeddings", ["--plot", "{out}"], "embeddings.png"),
]


def _args(tiny_run, verb, args, out) -> list[str]:
    if verb == "export" and importlib.util.find_spec("onnxscript") is None:
        pytest.skip("ONNX export needs onnxscript (pip install -e '.[onnx]')")
    return [verb, str(tiny_run), *[a.format(out=out) for a in args]]


@pytest.mark.parametrize(("verb", "args", "name"), WRITERS, ids=[w[0] for w in WRITERS])
def test_an_output_under_a_file(tiny_run, tmp_path, capsys, verb, args, name) -> None:
    """A path whose folder is a file fails for root too (a read-only folder does not stop root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = blocker / name
    assert_one_line_error(*run_cli(capsys, *_args(tiny_run, verb, args, out)), f"cannot write {out} (")
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(("verb", "args", "name"), WRITERS, ids=[w[0] for w in WRITERS])
def test_a_full_disk(tiny_run, tmp_path, capsys, monkeypatch, verb, args, name) -> None:
    import qkv.export.onnx
    import qkv.io

    def full(fd) -> None:  # noqa: ARG001
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(qkv.io.os, "fsync", full)  # qkv.io and the exporter share the os module
    assert qkv.export.onnx.os is qkv.io.os
    out = tmp_path / name
    code, err = run_cli(capsys, *_args(tiny_run, verb, args, out))
    monkeypatch.undo()
    err = "".join(line for line in err.splitlines(keepends=True) if "tracing" not in line)  # export's progress
    assert_one_line_error(code, err, "No space left on device")
    assert "free some space" in err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder(tiny_run, tmp_path, capsys) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        code, err = run_cli(capsys, "lens", str(tiny_run), "hello", "--out", str(folder / "lens.png"))
    finally:
        folder.chmod(0o755)
    assert_one_line_error(code, err, "Permission denied")
