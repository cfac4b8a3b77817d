"""Each dequantizer against gguf-py's (llama.cpp's reference in Python): the real file's Q4_1, Q8_0 and F32
tensors, and small tensors of the types it lacks (quantized by gguf-py, or random valid K-quant blocks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.gguf import DEQUANTIZERS, dequantize, read_gguf
from qkv.gguf.reader import GGML_TYPES, RawTensor
from tests.gguf_files import need


def reference(raw: RawTensor) -> torch.Tensor:
    gguf = need("gguf")
    values = gguf.quants.dequantize(raw.blocks, gguf.GGMLQuantizationType[raw.type])
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).reshape(raw.shape)


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                  "blk.3.attn_norm.weight"])  # fmt: skip
def test_real_file_tensors(smollm2, name):
    raw = read_gguf(smollm2).raw(name)
    assert raw.type == {"token_embd.weight": "Q8_0", "blk.3.attn_norm.weight": "F32"}.get(name, "Q4_1")
    assert torch.equal(dequantize(raw), reference(raw))


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_types_gguf_py_quantizes(kind):
    gguf = need("gguf")
    values = np.random.default_rng(1).normal(0.0, 2.0, size=(6, 96)).astype(np.float32)
    values[0, :32] = 0.0  # an all-zero block (scale 0)
    qtype = gguf.GGMLQuantizationType[kind]
    stored = values.view(np.uint8) if kind == "F32" else gguf.quants.quantize(values, qtype)
    raw = RawTensor("t", kind, (6, 96), stored.reshape(-1, gguf.GGML_QUANT_SIZES[qtype][1]))
    mine = dequantize(raw)
    assert torch.equal(mine, reference(raw))
    if kind != "F32":  # and it is the tensor, up to the type's rounding
        assert (mine - torch.from_numpy(values)).abs().max() < 0.8


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_quants_on_random_blocks(kind):
    """Random bytes are valid K-quant blocks once their float16 scales are finite."""
    gguf = need("gguf")
    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rng = np.random.default_rng(2)
    blocks = rng.integers(0, 256, size=(12, type_size), dtype=np.uint8)
    for offset in (208,) if kind == "Q6_K" else (0, 2):  # d (and dmin)
        blocks[:, offset : offset + 2] = rng.normal(size=(12, 1)).astype(np.float16).view(np.uint8)
    raw = RawTensor("t", kind, (3, 4 * block_size), blocks)
    assert torch.equal(dequantize(raw), reference(raw))


def test_type_table_is_ggmls():
    gguf = need("gguf")
    for type_id, (name, block_size, type_size) in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(type_id)
        assert qtype.name == name and gguf.GGML_QUANT_SIZES[qtype] == (block_size, type_size)
    assert set(DEQUANTIZERS) <= {t.name for t in GGML_TYPES.values()}


def test_out_is_filled_in_place():
    raw = RawTensor("t", "F16", (2, 3), np.arange(6, dtype=np.float16).view(np.uint8).reshape(-1, 2))
    out = torch.full((2, 3), -1.0)
    assert dequantize(raw, out) is not None and out.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_unsupported_type_is_one_line():
    raw = RawTensor("blk.0.attn_q.weight", "IQ2_XXS", (1, 256), np.zeros((1, 66), np.uint8))
    with pytest.raises(QkvError, match=r"blk\.0\.attn_q\.weight is stored as IQ2_XXS.*Q4_K") as error:
        dequantize(raw)
    assert "\n" not in str(error.value)
