"""The GGUF parser against gguf-py's GGUFReader, and every broken file as one line (QkvError; exit code 2)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

import qkv
from qkv.cli import main
from qkv.errors import QkvError
from qkv.gguf import is_gguf_file, read_gguf
from tests.gguf_files import need, write_file


@pytest.fixture
def small_file(tmp_path):
    metadata = {
        "general.name": "tiny",
        "tiny.block_count": 3,
        "tiny.epsilon": 1e-5,
        "tiny.flag": True,
        "tiny.words": ["a", "bc", "ünï 🙂"],
        "tiny.numbers": [3, -1, 7],
        "tiny.scores": [0.5, -2.25],
    }
    tensors = {
        "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b.weight": np.arange(64, dtype=np.float16).reshape(2, 32),
    }
    return write_file(tmp_path / "tiny.gguf", "tiny", metadata, tensors), metadata, tensors


def test_metadata_and_tensors_as_gguf_py_reads_them(small_file):
    gguf = need("gguf")
    path, metadata, tensors = small_file
    mine, theirs = read_gguf(path), gguf.GGUFReader(path)
    assert mine.architecture == "tiny" and is_gguf_file(path)
    for key, value in metadata.items():
        assert mine.metadata[key] == pytest.approx(value) if isinstance(value, float) else mine.metadata[key] == value
    assert set(mine.metadata) == set(theirs.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    for tensor in theirs.tensors:
        raw = mine.raw(tensor.name)
        assert raw.shape == tuple(reversed(tensor.shape.tolist())) and raw.type == tensor.tensor_type.name
        assert np.array_equal(raw.blocks.reshape(-1), tensor.data.view(np.uint8).reshape(-1))
    assert mine.raw("b.weight").blocks.shape == (64, 2)


def test_real_file_metadata(smollm2):
    file = read_gguf(smollm2)
    assert file.architecture == "llama" and file.metadata["llama.block_count"] == 30
    assert len(file.metadata["tokenizer.ggml.tokens"]) == 49152 and len(file.tensors) == 272
    raw = file.raw("blk.0.attn_q.weight")
    assert (raw.type, raw.shape, raw.blocks.shape, raw.blocks.dtype) == ("Q4_1", (576, 576), (10368, 20), np.uint8)


def one_line(error: pytest.ExceptionInfo, fragment: str) -> None:
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("hello, I am text\n")
    assert not is_gguf_file(path)
    with pytest.raises(QkvError) as error:
        read_gguf(path)
    one_line(error, "is not a GGUF file")


@pytest.mark.parametrize("keep", [6, 30, 200, 400])
def test_truncated(small_file, tmp_path, keep):
    path = tmp_path / "cut.gguf"
    path.write_bytes(small_file[0].read_bytes()[:keep])
    with pytest.raises(QkvError) as error:
        read_gguf(path)
    one_line(error, "truncated")


def test_empty_and_big_endian(tmp_path):
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(QkvError):
        read_gguf(tmp_path / "empty.gguf")
    (tmp_path / "be.gguf").write_bytes(b"GGUF" + struct.pack(">I", 3) + bytes(16))
    with pytest.raises(QkvError) as error:
        read_gguf(tmp_path / "be.gguf")
    one_line(error, "big-endian")


def test_unknown_tensor_type(small_file, tmp_path):
    data = bytearray(small_file[0].read_bytes())
    at = data.index(b"a.weight") + len(b"a.weight") + 4 + 2 * 8  # past the name, n_dims and both dims
    data[at : at + 4] = struct.pack("<I", 77)
    (tmp_path / "odd.gguf").write_bytes(bytes(data))
    with pytest.raises(QkvError) as error:
        read_gguf(tmp_path / "odd.gguf").raw("a.weight")
    one_line(error, "ggml type id 77")


def test_files_through_qkv_load_and_the_cli(tmp_path, small_file, capsys):
    text = tmp_path / "model.bin"
    text.write_bytes(b"\x00" * 64)
    with pytest.raises(QkvError, match="only model files qkv opens are GGUF"):
        qkv.load(text)
    with pytest.raises(QkvError, match="does not exist"):
        qkv.load(tmp_path / "missing.gguf")
    with pytest.raises(QkvError, match="'tiny' model"):  # a GGUF of an architecture qkv does not read
        qkv.load(small_file[0])
    for path in (text, small_file[0]):
        assert main(["generate", "--model", str(path), "--prompt", "hi"]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("note:")]
        assert len(lines) == 1 and "Traceback" not in lines[0]
