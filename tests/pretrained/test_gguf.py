"""The real SmolLM2 Q4_1 file loaded by qkv against transformers' GGUF loading of the same file, its memory
(measured in a fresh process), and the files qkv refuses."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import qkv
from qkv.errors import QkvError
from qkv.gguf import reader, tokenizer
from qkv.pretrained import gguf as loader
from qkv.pretrained.gguf import load_gguf
from tests.gguf_files import byte_level_tokenizer_metadata, logits, need, random_tensors, write_file

pytestmark = [
    pytest.mark.usefixtures("one_thread"),  # a 135M model on a busy machine: a second thread only waits
    pytest.mark.slow,  # among the longest modules: the workers start them first (tests/conftest.py)
]


def test_logits_equal_transformers(smollm2_qkv, smollm2_hf):
    text = " ".join(module.__doc__ for module in (reader, tokenizer, loader))  # a few hundred tokens of English
    ids = torch.tensor([smollm2_qkv.tokenizer.encode(text)[:300]])
    assert ids.shape[1] == 300
    delta = (logits(smollm2_qkv.model, ids) - logits(smollm2_hf, ids)).abs().max().item()
    assert delta <= 5e-4, delta


def greedy(model, ids: torch.Tensor, steps: int) -> list[int]:
    for _ in range(steps):
        ids = torch.cat([ids, logits(model, ids)[:, -1:].argmax(-1)], dim=1)
    return ids[0].tolist()


def test_greedy_tokens_equal_transformers(smollm2_qkv, smollm2_hf):
    prompt = torch.tensor([smollm2_qkv.tokenizer.encode("The three primary colors are")])
    assert greedy(smollm2_qkv.model, prompt, 32) == greedy(smollm2_hf, prompt, 32)


def test_bundle(smollm2_qkv, smollm2):
    config = smollm2_qkv.config
    shape = (config.n_layers, config.d_model, config.n_heads, config.n_kv_heads, config.vocab_size)
    assert shape == (30, 576, 9, 3, 49152)
    assert config.tie_embeddings and config.rope_base == 100000.0 and config.context_length == 8192
    assert smollm2_qkv.model.unembedding.weight is smollm2_qkv.model.embedding.token_embedding.weight
    assert smollm2_qkv.chat_template.startswith("{% for message in messages %}")
    assert not smollm2_qkv.model.training and smollm2_qkv.path == smollm2
    assert type(qkv.load(str(smollm2)).model) is type(smollm2_qkv.model)  # qkv.load reads it by its first bytes


MEASURE = """
import json, resource, sys, torch
import qkv.pretrained.gguf
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
bundle = qkv.pretrained.gguf.load_gguf(sys.argv[1], dequantize=True)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
weights = sum(p.numel() * p.element_size() for p in bundle.model.parameters())
print(json.dumps({"peak": (after - before) * 1024, "weights": weights}))
"""


def test_peak_memory_is_one_float_copy(smollm2):
    """ru_maxrss of a fresh process, from just before load_gguf to after: at most 1.3x the float32 weights."""
    out = subprocess.run([sys.executable, "-c", MEASURE, str(smollm2)], capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["peak"] <= 1.3 * measured["weights"], measured


def tiny_llama(tmp_path, name="tiny.gguf", arch="llama", extra=None, types=None):
    tokenizer = byte_level_tokenizer_metadata()
    vocab, d = len(tokenizer["tokenizer.ggml.tokens"]), 16
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    parts = {"attn_norm": (d,), "attn_q": (d, d), "attn_k": (8, d), "attn_v": (8, d), "attn_output": (d, d),
             "ffn_norm": (d,), "ffn_gate": (32, d), "ffn_up": (32, d), "ffn_down": (d, 32)}  # fmt: skip
    shapes.update({f"blk.0.{part}.weight": shape for part, shape in parts.items()})
    metadata = {
        f"{arch}.block_count": 1, f"{arch}.context_length": 32, f"{arch}.embedding_length": d,
        f"{arch}.feed_forward_length": 32, f"{arch}.attention.head_count": 2, f"{arch}.attention.head_count_kv": 1,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-5, **tokenizer, **(extra or {}),
    }  # fmt: skip
    tensors = random_tensors(shapes)
    for tensor, kind in (types or {}).items():
        tensors[tensor] = tensors[tensor].astype(kind)
    return write_file(tmp_path / name, arch, metadata, tensors)


def test_a_small_written_file_loads(tmp_path):
    bundle = load_gguf(tiny_llama(tmp_path, types={"blk.0.ffn_up.weight": np.float16}))
    assert bundle.config.n_kv_heads == 1 and bundle.config.tie_embeddings and bundle.chat_template is None


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"llama.block_count": 0}, "llama.block_count=0, which must be a positive whole number"),
        ({"llama.attention.head_count": 3}, "do not divide"),
        ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "must be a positive number"),
        ({"llama.rope.dimension_count": 4}, "rotates part of each head"),
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "scales RoPE"),
        ({"tokenizer.ggml.model": "bert"}, "llama.cpp's 'bert' model"),
        ({"tokenizer.ggml.pre": "tekken"}, "pre-tokenizer 'tekken'"),
        ({"tokenizer.ggml.eos_token_id": 9999}, "eos_token_id=9999 is not an id"),
    ],
)
def test_bad_metadata_is_one_line(tmp_path, extra, fragment):
    with pytest.raises(QkvError) as error:
        load_gguf(tiny_llama(tmp_path, extra=extra))
    assert fragment in str(error.value) and "\n" not in str(error.value) and "tiny.gguf" in str(error.value)


def test_unsupported_architecture_and_tensor_type(tmp_path):
    with pytest.raises(QkvError, match=r"'falcon' model \(general.architecture\).*gpt2, starcoder2, llama, qwen2"):
        load_gguf(tiny_llama(tmp_path, arch="falcon"))
    path = tiny_llama(tmp_path, name="i32.gguf", types={"blk.0.ffn_up.weight": np.int32})
    with pytest.raises(QkvError, match=r"blk\.0\.ffn_up\.weight is stored as I32"):
        load_gguf(path)


def rewritten(path, out, *, drop: str | None = None, add: str | None = None):
    """A copy of GGUF file ``path`` (metadata and tensors, through gguf-py) without tensor ``drop`` and with a
    small tensor ``add``."""
    gguf = need("gguf")
    reader, writer = gguf.GGUFReader(path), gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if not field.name.startswith(("GGUF.", "general.architecture")):
            element = field.types[-1] if len(field.types) > 1 else None
            writer.add_key_value(field.name, field.contents(), field.types[0], element)
    for tensor in reader.tensors:
        if tensor.name != drop:
            writer.add_tensor(tensor.name, np.array(tensor.data))
    if add:
        writer.add_tensor(add, np.zeros(4, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_unknown_and_missing_tensors(tmp_path):
    path = tiny_llama(tmp_path)
    with pytest.raises(QkvError, match="holds tensor blk.0.mystery.weight, which qkv's llama table does not know"):
        load_gguf(rewritten(path, tmp_path / "extra.gguf", add="blk.0.mystery.weight"))
    with pytest.raises(QkvError, match=r"lacks tensor blk\.0\.ffn_gate\.weight \(qkv decoder.blocks.0"):
        load_gguf(rewritten(path, tmp_path / "less.gguf", drop="blk.0.ffn_gate.weight"))
