"""GPT-2 imported into qkv's GPT: logits and greedy generations equal Hugging Face's, tokenizer too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from qkv.decoding import generate
from qkv.model_dir import load_model_dir
from qkv.models import GPT
from qkv.models.gpt.huggingface import load_tokenizer
from qkv.pretrained import convert_gpt2, load_pretrained, read_hf_config, read_hf_weights, save_as_qkv

transformers = pytest.importorskip("transformers")

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces, a tab\tand\nnew lines\n\n",
    "Ünïcödé, émojis 🙂🙂 and <|endoftext|> typed as text",
    "tokens are little pieces",
]


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 300, (3, 20))
    mask = torch.ones_like(ids)
    mask[1, 14:] = 0  # right padding
    mask[2, 5:] = 0
    return ids, mask


def test_logits_match_transformers_with_padding(gpt2_dir: Path, gpt2_hf: torch.nn.Module) -> None:
    bundle = load_pretrained(gpt2_dir)
    assert isinstance(bundle.model, GPT) and not bundle.model.training
    config = bundle.config
    assert (config.n_layers, config.d_model, config.n_heads, config.context_length) == (2, 64, 4, 64)
    assert config.activation == "gelu_tanh" and config.norm_first and config.tie_embeddings
    ids, mask = _batch()
    with torch.no_grad():
        reference = gpt2_hf(ids, attention_mask=mask).logits
        ours = bundle.model(ids, key_padding_mask=mask == 0)
    real = mask.bool()
    torch.testing.assert_close(ours[real], reference[real], atol=1e-4, rtol=1e-4)
    assert bundle.model.unembedding.weight is bundle.model.embedding.token_embedding.weight  # W_U = W_E^T


def test_greedy_generation_matches_transformers(gpt2_dir: Path, gpt2_hf: torch.nn.Module) -> None:
    bundle = load_pretrained(gpt2_dir)
    eos = bundle.tokenizer.eos_id
    for text in ("The quick brown", "A man is"):
        prompt = torch.tensor([bundle.tokenizer.encode(text)])
        reference = gpt2_hf.generate(prompt, do_sample=False, max_new_tokens=20, pad_token_id=eos, eos_token_id=eos)
        ours = generate(bundle.model, prompt, max_new_tokens=20, temperature=0.0, eos_id=eos)
        assert ours.tolist() == reference.tolist()


def test_tokenizer_from_vocab_and_merges_matches_transformers(gpt2_dir: Path, tmp_path: Path) -> None:
    reference = transformers.GPT2Tokenizer(str(gpt2_dir / "vocab.json"), str(gpt2_dir / "merges.txt"))
    ours = load_tokenizer(gpt2_dir)
    assert ours.bos_id == ours.eos_id == reference.convert_tokens_to_ids("<|endoftext|>")
    assert ours.pad_id is None and ours.unk_id is None
    for text in TEXTS[:2]:
        assert ours.encode(text) == reference.encode(text)
    for text in TEXTS:
        assert ours.decode(ours.encode(text)) == text
    # A tokenizer.json next to the files wins over them, and encodes the same way.
    ours.hf.save(str(tmp_path / "tokenizer.json"))
    from_json = load_tokenizer(tmp_path)
    assert all(from_json.encode(t) == ours.encode(t) for t in TEXTS)
    assert from_json.encode("a", add_bos=True, add_eos=True)[::2] == [ours.bos_id, ours.eos_id]


def test_old_pytorch_bin_checkpoint(gpt2_dir: Path, gpt2_hf: torch.nn.Module, tmp_path: Path) -> None:
    """pytorch_model.bin with GPT2Model's names and the attn.bias/masked_bias buffers of old checkpoints."""
    state = {k.removeprefix("transformer."): v for k, v in gpt2_hf.state_dict().items()}
    n = gpt2_hf.config.n_positions
    for i in range(gpt2_hf.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state, tmp_path / "pytorch_model.bin")
    shutil.copy(gpt2_dir / "config.json", tmp_path)
    model = convert_gpt2(read_hf_weights(tmp_path), read_hf_config(tmp_path)).eval()
    ids, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), gpt2_hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_pytorch_bin_with_code_is_refused(gpt2_dir: Path, tmp_path: Path) -> None:
    from qkv.errors import QkvError

    torch.save({"weights": torch.zeros(2), "hook": print}, tmp_path / "pytorch_model.bin")
    shutil.copy(gpt2_dir / "config.json", tmp_path)
    with pytest.raises(QkvError, match="cannot be read as plain tensors"):
        read_hf_weights(tmp_path)


def test_sharded_safetensors(gpt2_dir: Path, gpt2_hf: torch.nn.Module, tmp_path: Path) -> None:
    gpt2_hf.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    shards = set(json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"].values())
    assert len(shards) > 1
    model = convert_gpt2(read_hf_weights(tmp_path), read_hf_config(tmp_path)).eval()
    ids, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), gpt2_hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_save_as_qkv_reloads(gpt2_dir: Path, tmp_path: Path) -> None:
    bundle = load_pretrained(gpt2_dir)
    save_as_qkv(bundle, tmp_path / "qkv")
    again = load_model_dir(tmp_path / "qkv")
    assert again.config == bundle.config and again.tokenizer.encode(TEXTS[0]) == bundle.tokenizer.encode(TEXTS[0])
    ids, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids), bundle.model(ids))
    assert load_pretrained(tmp_path / "qkv").config == bundle.config  # a qkv folder loads through the same door
