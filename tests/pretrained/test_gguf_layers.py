"""GGUF matrices kept quantized as they load: Q4_0, Q4_1 and Q4_K as int4 layers holding the numbers gguf-py
dequantizes (Q4_K within its scales' float16 rounding), Q8_0 as int8 in groups of 32 holding them exactly, the
tied Q8_0 embedding as the grouped int8 unembedding, Q6_K and float tensors as float32; ``dequantize=True`` keeps
the old all-float load. The real SmolLM2 file keeps its 210 Q4_1 matrices, its Q8_0 embedding and its size."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import qkv
from qkv.model_dir import QUANTIZATION_FILE, load_model_dir, save_model_dir
from qkv.pretrained.gguf import load_gguf
from qkv.quantization import Int4Linear, Int8Linear, Int8TokenEmbedding, set_activations, weight_bytes
from tests.gguf_files import byte_level_tokenizer_metadata, need, random_tensors, write_file

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

D, FF = 256, 512  # Q4_K's blocks hold 256 weights: every matrix's rows are a whole number of them
TYPES = {  # GGUF tensor -> the type it is written in, and the qkv layer it must become
    "token_embd.weight": ("Q8_0", Int8TokenEmbedding),  # tied to W_U (no output.weight)
    "blk.0.attn_q.weight": ("Q4_0", Int4Linear),  # rows permuted for llama.cpp's RoPE: unpermuted as blocks
    "blk.0.attn_k.weight": ("Q4_1", Int4Linear),
    "blk.0.attn_v.weight": ("Q8_0", Int8Linear),
    "blk.0.attn_output.weight": ("F16", nn.Linear),
    "blk.0.ffn_gate.weight": ("Q4_K", Int4Linear),
    "blk.0.ffn_up.weight": ("Q6_K", nn.Linear),  # more than 4 bits: kept float
    "blk.0.ffn_down.weight": ("F32", nn.Linear),
}


def k_quant_blocks(rows: int, cols: int, kind: str, seed: int) -> np.ndarray:
    """Random but valid Q4_K / Q6_K blocks (gguf-py cannot quantize to them): random bytes, sane float16 scales."""
    rng = np.random.default_rng(seed)
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    scales = (rng.random((blocks.shape[0], 2)) * 2e-3 + 1e-4).astype(np.float16).view(np.uint8)
    if kind == "Q4_K":
        blocks[:, 0:4] = scales  # d, dmin
    else:
        blocks[:, 208:210] = scales[:, :2]  # d
    return blocks.reshape(rows, -1)


def mixed_file(tmp_path):
    gguf = need("gguf")
    tokenizer = byte_level_tokenizer_metadata()
    vocab = len(tokenizer["tokenizer.ggml.tokens"])
    shapes = {"token_embd.weight": (vocab, D), "output_norm.weight": (D,), "blk.0.attn_norm.weight": (D,),
              "blk.0.ffn_norm.weight": (D,), "blk.0.attn_q.weight": (D, D), "blk.0.attn_k.weight": (128, D),
              "blk.0.attn_v.weight": (128, D), "blk.0.attn_output.weight": (D, D), "blk.0.ffn_gate.weight": (FF, D),
              "blk.0.ffn_up.weight": (FF, D), "blk.0.ffn_down.weight": (D, FF)}  # fmt: skip
    tensors, blocks = random_tensors(shapes), {}
    for i, (name, (kind, _)) in enumerate(TYPES.items()):
        if kind in ("Q4_0", "Q4_1", "Q8_0"):
            tensors[name] = gguf.quants.quantize(tensors[name], gguf.GGMLQuantizationType[kind])
        elif kind in ("Q4_K", "Q6_K"):
            tensors[name] = k_quant_blocks(*shapes[name], kind, seed=i)
        elif kind == "F16":
            tensors[name] = tensors[name].astype(np.float16)
        blocks.update({name: kind} if kind.startswith("Q") else {})
    metadata = {"llama.block_count": 1, "llama.context_length": 32, "llama.embedding_length": D,
                "llama.feed_forward_length": FF, "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
                "llama.attention.layer_norm_rms_epsilon": 1e-5, **tokenizer}  # fmt: skip
    return write_file(tmp_path / "mixed.gguf", "llama", metadata, tensors, blocks)


QKV_NAMES = {
    "blk.0.attn_q.weight": "decoder.blocks.0.self_attn.query",
    "blk.0.attn_k.weight": "decoder.blocks.0.self_attn.key",
    "blk.0.attn_v.weight": "decoder.blocks.0.self_attn.value",
    "blk.0.attn_output.weight": "decoder.blocks.0.self_attn.out_proj",
    "blk.0.ffn_gate.weight": "decoder.blocks.0.feed_forward.gate",
    "blk.0.ffn_up.weight": "decoder.blocks.0.feed_forward.linear1",
    "blk.0.ffn_down.weight": "decoder.blocks.0.feed_forward.linear2",
    "token_embd.weight": "embedding.token_embedding",
}


def test_each_block_type_loads_as_its_layer_with_the_files_numbers(tmp_path) -> None:
    path = mixed_file(tmp_path)
    kept, exact = load_gguf(path).model, load_gguf(path, dequantize=True).model
    for name, (kind, layer_type) in TYPES.items():
        layer, float_layer = kept.get_submodule(QKV_NAMES[name]), exact.get_submodule(QKV_NAMES[name])
        assert isinstance(layer, layer_type), name
        assert not isinstance(float_layer, (Int4Linear, Int8Linear, Int8TokenEmbedding)), name
        ours, theirs = layer.weight, float_layer.weight
        if kind in ("Q4_0", "Q4_1", "Q8_0", "F16", "F32", "Q6_K"):
            assert torch.equal(ours, theirs), name  # W_q's rows unpermuted as whole rows of blocks
        elif kind == "Q4_K":  # s = d sc and m = -dmin mn rounded to float16
            s = layer.weight_scale.float().repeat_interleave(32, dim=1)
            m = layer.weight_min.float().repeat_interleave(32, dim=1)
            assert ((ours - theirs).abs() <= (15 * s.abs() + m.abs()) * 2**-11 + 1e-7).all(), name
        if kind == "Q8_0":
            assert layer.group_size == 32, name
    assert isinstance(kept.unembedding, Int8Linear) and kept.unembedding.group_size == 32
    assert kept.embedding.token_embedding.qweight is kept.unembedding.qweight  # the tie survives
    ids = torch.tensor([[5, 17, 99, 3]])
    assert torch.equal(kept.embedding.token_embedding(ids), exact.embedding.token_embedding(ids))
    with torch.no_grad():
        assert torch.allclose(kept(ids), exact(ids), atol=0.05 * exact(ids).abs().max().item())


def test_a_saved_folder_records_the_q8_0_groups_and_loads_back_exactly(tmp_path) -> None:
    bundle = load_gguf(mixed_file(tmp_path))
    save_model_dir(tmp_path / "saved", bundle.model, bundle.tokenizer)
    info = json.loads((tmp_path / "saved" / QUANTIZATION_FILE).read_text())
    assert info["scheme"] == "int4" and info["int8_group_size"] == 32
    assert sorted(info["int8_modules"]) == ["decoder.blocks.0.self_attn.value", "unembedding"]
    again = load_model_dir(tmp_path / "saved").model
    assert again.unembedding.group_size == 32 and again.decoder.blocks[0].self_attn.value.group_size == 32
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        assert torch.equal(again(ids), bundle.model(ids))


def test_dequantize_is_the_old_all_float_load_and_qkv_load_passes_it(tmp_path) -> None:
    path = mixed_file(tmp_path)
    model = qkv.load(path, dequantize=True).model
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not any(isinstance(m, (Int4Linear, Int8Linear)) for m in model.modules())
    assert any(isinstance(m, Int4Linear) for m in qkv.load(path).model.modules())


def test_the_real_file_keeps_its_q4_1_blocks(smollm2) -> None:
    kept = load_gguf(smollm2)
    int4 = [m for m in kept.model.modules() if isinstance(m, Int4Linear)]
    assert len(int4) == 210 and all(m.group_size == 32 for m in int4)  # 30 blocks x 7 matrices
    unembedding = kept.model.unembedding
    assert isinstance(unembedding, Int8Linear) and unembedding.group_size == 32  # the file's Q8_0 blocks
    reader = need("gguf").GGUFReader(smollm2)
    token_embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    theirs = torch.from_numpy(need("gguf").quants.dequantize(token_embd.data, token_embd.tensor_type))
    assert torch.equal(unembedding.weight, theirs)  # exactly the gguf package's numbers
    ids = torch.tensor([[1, 600, 49151]])
    assert torch.equal(kept.model.embedding.token_embedding(ids), theirs[ids])  # the tied embedding reads them
    assert 90e6 < weight_bytes(kept.model) < 102e6  # the file is 98 MB; float32 would be 538 MB
    exact = load_gguf(smollm2, dequantize=True).model
    for name in ("decoder.blocks.0.self_attn.query", "decoder.blocks.29.feed_forward.linear2"):
        assert torch.equal(kept.model.get_submodule(name).weight, exact.get_submodule(name).weight)
    ids = torch.tensor([kept.tokenizer.encode("The three primary colors are red, yellow and")])
    with torch.no_grad():
        ours, theirs = kept.model(ids)[0, -1], exact(ids)[0, -1]
    assert ours.argmax() == theirs.argmax()
    assert (ours - theirs).abs().max() <= 0.05 * theirs.abs().max()  # bfloat16 x, the int8 embedding


def test_qkv_quantize_requantizes_a_gguf_from_its_numbers(tmp_path, capsys) -> None:
    """A .gguf's blocks are quantized already; `qkv quantize` reads its numbers in float32 and quantizes those, as
    `qkv.load(file, quantize=...)` does (W8A8 smoothed first, the same way)."""
    from qkv.cli import main

    path = mixed_file(tmp_path)
    out = tmp_path / "w8a8"
    assert main(["quantize", "--model", str(path), "--out", str(out), "--activations", "int8"]) == 0
    assert "inputs smoothed" in capsys.readouterr().err
    saved = qkv.load(out).model
    assert all(isinstance(m, Int8Linear) for m in (saved.decoder.blocks[0].feed_forward.linear2, saved.unembedding))
    ids = torch.tensor([[5, 9, 40, 17, 3, 250]])
    with torch.no_grad():
        expected = qkv.load(path, quantize="int8", activations="int8").model(ids)
        torch.testing.assert_close(saved(ids), expected, rtol=0, atol=1e-6)


def test_on_the_real_file_x_rounded_twice_gives_the_weight_only_numbers(smollm2) -> None:
    """SmolLM2's Q4_1 blocks in the native decode step, a few positions teacher-forced: with x rounded to int8 once
    (W4A8) the logits move from the weight-only ones by more than 20 times what they move with x rounded twice."""
    from qkv.decoding.fast_step import fast_step_for

    model = load_gguf(smollm2).model
    ids = torch.tensor(load_gguf(smollm2).tokenizer.encode("The three primary colors are red, yellow and blue."))
    config = model.config

    def logits(activations: str) -> torch.Tensor:
        set_activations(model, activations)
        step = fast_step_for(model).native()
        if isinstance(step, str):
            pytest.skip(f"the native step cannot run here: {step}")
        cache = torch.zeros(config.n_layers, 1, 2, config.n_kv_heads, len(ids), config.head_dim)
        with torch.no_grad():
            return torch.cat([step(ids[t : t + 1], torch.tensor([t]), cache) for t in range(len(ids))])

    exact, once, twice = logits("float"), logits("int8"), logits("int8x2")
    assert (twice - exact).abs().max() * 20 < (once - exact).abs().max()
    assert torch.equal(twice.argmax(-1), exact.argmax(-1))
