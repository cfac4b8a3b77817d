"""Reading a GGUF file (llama.cpp's format): its metadata, and where each tensor's bytes lie.

The layout (GGUF versions 2 and 3, little-endian; ggml's docs/gguf.md)::

    "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x      key (string) | value type u32 | value
    tensor_count x  name (string) | n_dims u32 | n_dims x u64 (ggml order: the innermost, contiguous one first)
                    | ggml type u32 | offset u64 (from the start of the data)
    padding to general.alignment (32 unless the metadata says) | the tensors' bytes

A string is a u64 byte count and UTF-8 bytes; an array is an element type u32, a u64 count and the elements.
A tensor of ggml type T is a run of blocks, each ``block_size`` numbers stored in ``type_size`` bytes
(:data:`GGML_TYPES`; F32 is a "block" of one number in 4 bytes, Q4_1 one of 32 numbers in 20 bytes).

The file is memory-mapped: :meth:`GGUFFile.raw` hands out a tensor's blocks as a numpy view of the file, with
no copy and nothing dequantized (:mod:`qkv.gguf.dequantize` turns them into floats). This parser replaces
``gguf.GGUFReader``, which builds a numpy view per string and spent 3 s on SmolLM2's 98,000 vocabulary and
merge strings alone; every problem with the file is one :class:`~qkv.errors.QkvError` line.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from qkv.errors import QkvError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32


class GGMLType(NamedTuple):
    """A ggml tensor type: ``block_size`` numbers stored in ``type_size`` bytes."""

    name: str
    block_size: int
    type_size: int


GGML_TYPES: dict[int, GGMLType] = {
    t[0]: GGMLType(*t[1:])
    for t in [
        (0, "F32", 1, 4), (1, "F16", 1, 2), (2, "Q4_0", 32, 18), (3, "Q4_1", 32, 20), (6, "Q5_0", 32, 22),
        (7, "Q5_1", 32, 24), (8, "Q8_0", 32, 34), (9, "Q8_1", 32, 40), (10, "Q2_K", 256, 84),
        (11, "Q3_K", 256, 110), (12, "Q4_K", 256, 144), (13, "Q5_K", 256, 176), (14, "Q6_K", 256, 210),
        (15, "Q8_K", 256, 292), (16, "IQ2_XXS", 256, 66), (17, "IQ2_XS", 256, 74), (18, "IQ3_XXS", 256, 98),
        (19, "IQ1_S", 256, 50), (20, "IQ4_NL", 32, 18), (21, "IQ3_S", 256, 110), (22, "IQ2_S", 256, 82),
        (23, "IQ4_XS", 256, 136), (24, "I8", 1, 1), (25, "I16", 1, 2), (26, "I32", 1, 4), (27, "I64", 1, 8),
        (28, "F64", 1, 8), (29, "IQ1_M", 256, 56), (30, "BF16", 1, 2), (34, "TQ1_0", 256, 54),
        (35, "TQ2_0", 256, 66), (39, "MXFP4", 32, 17),
    ]
}  # fmt: skip
"""ggml type id -> (name, block_size, type_size): ggml's ggml_type_traits, as gguf-py's GGML_QUANT_SIZES."""

# GGUF value type id -> struct format of one element (8: string, 9: array are read apart).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies: its ggml type, its shape in torch's order (outermost first) and its bytes."""

    name: str
    type_id: int
    shape: tuple[int, ...]
    offset: int  # from the start of the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        known = GGML_TYPES.get(self.type_id)
        return known.name if known else f"ggml type {self.type_id}"


@dataclass(frozen=True)
class RawTensor:
    """A tensor as stored: ``blocks`` (n_blocks, type_size) uint8 of ggml type ``type``, for ``shape`` numbers
    (torch order; the last dimension is ggml's contiguous one, so each row is a whole number of blocks)."""

    name: str
    type: str
    shape: tuple[int, ...]
    blocks: np.ndarray

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class _Cursor:
    """Reads the header's values one after the other; reading past the end is a "truncated" QkvError."""

    def __init__(self, buffer: mmap.mmap, path: Path) -> None:
        self.buffer, self.path, self.pos = buffer, path, 0

    def truncated(self, what: str) -> QkvError:
        return QkvError(
            f"{self.path} is truncated or damaged (it ends, or stops making sense, inside {what}): "
            "download or write the file again"
        )

    def unpack(self, fmt: str, what: str) -> Any:
        try:
            value = struct.unpack_from("<" + fmt, self.buffer, self.pos)
        except struct.error:
            raise self.truncated(what) from None
        self.pos += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self, what: str) -> str:
        length = self.unpack("Q", what)
        if self.pos + length > len(self.buffer):
            raise self.truncated(what)
        data = self.buffer[self.pos : self.pos + length]
        self.pos += length
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise QkvError(f"{what} in {self.path} is not UTF-8 text: the file is damaged; write it again") from None

    def value(self, kind: int, what: str) -> Any:
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY:
            return self.array(what)
        if kind not in _SCALARS:
            raise QkvError(f"{what} in {self.path} has value type {kind}, which GGUF does not define: file damaged")
        return self.unpack(_SCALARS[kind], what)

    def array(self, what: str) -> list[Any]:
        kind, count = self.unpack("I", what), self.unpack("Q", what)
        if kind == _STRING:
            return [self.string(what) for _ in range(count)]
        if kind == _ARRAY:
            return [self.array(what) for _ in range(count)]
        if kind not in _SCALARS:
            raise QkvError(f"{what} in {self.path} holds values of type {kind}, which GGUF does not define")
        dtype = np.dtype("<" + _SCALARS[kind])
        if self.pos + count * dtype.itemsize > len(self.buffer):
            raise self.truncated(what)
        values = np.frombuffer(self.buffer, dtype, count, self.pos).tolist()
        self.pos += count * dtype.itemsize
        return values


def is_gguf_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts with GGUF's magic bytes (whatever its name ends in)."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == MAGIC
    except OSError:
        return False


class GGUFFile:
    """An open GGUF file: ``metadata`` (key -> value), ``tensors`` (name -> :class:`TensorInfo`, in file order)
    and :meth:`raw` for a tensor's quantized blocks. ``architecture`` is general.architecture."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as file:
                self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as error:  # ValueError: an empty file cannot be mapped
            if isinstance(error, FileNotFoundError):
                raise QkvError(f"{self.path} does not exist: check the path to the .gguf file") from None
            raise QkvError(f"{self.path} cannot be read as a GGUF file ({error}): check the file") from None
        cursor = _Cursor(self._map, self.path)
        self._check_magic(cursor)
        n_tensors, n_keys = cursor.unpack("Q", "the header"), cursor.unpack("Q", "the header")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_keys):
            key = cursor.string("a metadata key")
            self.metadata[key] = cursor.value(cursor.unpack("I", f"metadata {key}"), f"metadata {key}")
        infos = [self._tensor_info(cursor) for _ in range(n_tensors)]
        alignment = self.metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment < 1:
            raise QkvError(f"{self.path} sets general.alignment={alignment!r}: the file is damaged; write it again")
        start = -(-cursor.pos // alignment) * alignment
        self.tensors = {name: self._place(name, kind, shape, start + offset) for name, kind, shape, offset in infos}

    def _check_magic(self, cursor: _Cursor) -> None:
        if self._map[:4] != MAGIC:
            raise QkvError(
                f"{self.path} is not a GGUF file (it does not start with the bytes 'GGUF'): give a .gguf model "
                "file, a run directory or a Hugging Face folder"
            )
        cursor.pos = 4
        version = cursor.unpack("I", "the header")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            kind = "a big-endian GGUF" if swapped in (2, 3) else f"GGUF version {version}"
            raise QkvError(f"{self.path} is {kind}; qkv reads little-endian GGUF versions 2 and 3: convert it again")

    def _tensor_info(self, cursor: _Cursor) -> tuple[str, int, tuple[int, ...], int]:
        name = cursor.string("a tensor name")
        n_dims = cursor.unpack("I", f"tensor {name}")
        if n_dims > 8:
            raise cursor.truncated(f"tensor {name}")
        dims = [cursor.unpack("Q", f"tensor {name}") for _ in range(n_dims)]
        kind, offset = cursor.unpack("I", f"tensor {name}"), cursor.unpack("Q", f"tensor {name}")
        return name, kind, tuple(reversed(dims)), offset

    def _place(self, name: str, kind: int, shape: tuple[int, ...], offset: int) -> TensorInfo:
        known = GGML_TYPES.get(kind)
        if known is None:
            return TensorInfo(name, kind, shape, offset, 0)  # refused when it is read (raw)
        numel = math.prod(shape)
        if shape and shape[-1] % known.block_size:
            raise QkvError(
                f"tensor {name} in {self.path} has rows of {shape[-1]} numbers, not a whole number of "
                f"{known.name} blocks of {known.block_size}: the file is damaged; write it again"
            )
        n_bytes = numel // known.block_size * known.type_size
        if offset + n_bytes > len(self._map):
            raise QkvError(
                f"{self.path} is truncated: tensor {name} needs bytes up to {offset + n_bytes:,}, but the file has "
                f"{len(self._map):,}; download or write it again"
            )
        return TensorInfo(name, kind, shape, offset, n_bytes)

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def raw(self, name: str) -> RawTensor:
        """Tensor ``name``'s blocks as stored (a read-only numpy view of the file; nothing is dequantized)."""
        if name not in self.tensors:
            raise QkvError(f"{self.path} has no tensor {name!r}: it holds {', '.join(list(self.tensors)[:5])}, ...")
        info = self.tensors[name]
        known = GGML_TYPES.get(info.type_id)
        if known is None:
            raise QkvError(
                f"tensor {name} in {self.path} is of ggml type id {info.type_id}, which qkv does not know: "
                "convert the model again with a common type (F16, Q8_0, Q4_K, ...)"
            )
        blocks = np.frombuffer(self._map, np.uint8, info.n_bytes, info.offset).reshape(-1, known.type_size)
        return RawTensor(name, known.name, info.shape, blocks)

    def release(self, name: str) -> None:
        """Let the system drop tensor ``name``'s pages from memory (they are read again if used again)."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = info.offset // page * page
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED") and info.n_bytes:
            self._map.madvise(mmap.MADV_DONTNEED, start, info.offset + info.n_bytes - start)


def read_gguf(path: str | Path) -> GGUFFile:
    """Open ``path`` as a GGUF file (metadata and tensor table read, tensors mapped, none dequantized)."""
    return GGUFFile(path)
