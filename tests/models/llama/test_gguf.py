"""llama and qwen2 files written with gguf-py's GGUFWriter (random weights), read by qkv and by transformers."""

from __future__ import annotations

import pytest
import torch

from qkv.pretrained.gguf import load_gguf
from tests.gguf_files import byte_level_tokenizer_metadata, hf_from_gguf, logits, need, random_tensors, write_file


def write_model(tmp_path, arch: str, *, n_heads=4, n_kv_heads=2, d=32, layers=2, tied=True):
    need("gguf")
    tokenizer = byte_level_tokenizer_metadata()
    vocab, kv = len(tokenizer["tokenizer.ggml.tokens"]), d // n_heads * n_kv_heads
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    if not tied:
        shapes["output.weight"] = (vocab, d)
    for i in range(layers):
        parts = {"attn_norm.weight": (d,), "attn_q.weight": (d, d), "attn_k.weight": (kv, d), "attn_v.weight": (kv, d),
                 "attn_output.weight": (d, d), "ffn_norm.weight": (d,), "ffn_gate.weight": (48, d),
                 "ffn_up.weight": (48, d), "ffn_down.weight": (d, 48)}  # fmt: skip
        if arch == "qwen2":
            parts.update({"attn_q.bias": (d,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        shapes.update({f"blk.{i}.{name}": shape for name, shape in parts.items()})
    metadata = {
        f"{arch}.block_count": layers, f"{arch}.context_length": 256, f"{arch}.embedding_length": d,
        f"{arch}.feed_forward_length": 48, f"{arch}.attention.head_count": n_heads,
        f"{arch}.attention.head_count_kv": n_kv_heads, f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6, **tokenizer,
    }  # fmt: skip
    return write_file(tmp_path / f"{arch}.gguf", arch, metadata, random_tensors(shapes))


@pytest.mark.parametrize(("arch", "tied"), [("llama", False), ("llama", True), ("qwen2", True)])
def test_logits_equal_transformers(tmp_path, arch, tied):
    path = write_model(tmp_path, arch, tied=tied)
    bundle = load_gguf(path)
    assert bundle.config.qkv_bias == (arch == "qwen2") and bundle.config.tie_embeddings == tied
    ids = torch.tensor([bundle.tokenizer.encode("the theory of everything, in the end " * 3)])
    delta = (logits(bundle.model, ids) - logits(hf_from_gguf(path), ids)).abs().max().item()
    assert delta < 1e-4, delta


def test_llama_file_with_qkv_biases_is_refused(tmp_path):
    path = write_model(tmp_path, "qwen2")
    data = path.read_bytes().replace(b"qwen2", b"llama")  # same length: the names of the keys and the arch
    (tmp_path / "biased.gguf").write_bytes(data)
    from qkv.errors import QkvError

    with pytest.raises(QkvError, match="biases on W_q, W_k and W_v"):
        load_gguf(tmp_path / "biased.gguf")
