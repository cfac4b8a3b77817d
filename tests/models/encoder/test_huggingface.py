"""BERT/MiniLM imported into qkv's Encoder: hidden states equal Hugging Face's, and the tokenizer from vocab.txt
equals the one from tokenizer.json."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from qkv.models import Encoder
from qkv.models.encoder.huggingface import load_tokenizer
from qkv.pretrained import convert_bert, read_hf_config, read_hf_weights
from tests.pretrained.conftest import perturb

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
]


def _small_bert(folder: Path, cls: type) -> torch.nn.Module:
    torch.manual_seed(2)
    config = transformers.BertConfig(
        vocab_size=120, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
        max_position_embeddings=40, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
    )  # fmt: skip
    model = cls(config).eval()
    perturb(model, 0.1)
    model.save_pretrained(folder)
    return model


def test_hidden_states_match_transformers_with_padding(tmp_path: Path) -> None:
    reference = _small_bert(tmp_path, transformers.BertModel)
    model = convert_bert(read_hf_weights(tmp_path), read_hf_config(tmp_path)).eval()
    assert isinstance(model, Encoder) and model.config.layer_norm_eps == 1e-12 and not model.config.norm_first
    ids = torch.randint(1, 120, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    mask[2, 4:] = 0
    types = torch.zeros_like(ids)
    types[0, 6:] = 1  # a sentence pair: segment B
    with torch.no_grad():
        expected = reference(ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        ours = model(ids, padding_mask=mask == 0, token_type_ids=types)
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-4)


def test_pretraining_heads_and_pooler_are_ignored(tmp_path: Path) -> None:
    reference = _small_bert(tmp_path, transformers.BertForPreTraining)  # "bert." names, pooler, cls.* heads
    model = convert_bert(read_hf_weights(tmp_path), read_hf_config(tmp_path)).eval()
    ids = torch.randint(1, 120, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference.bert(ids).last_hidden_state, atol=1e-4, rtol=1e-4)


def test_vocab_txt_tokenizer_matches_tokenizer_json(minilm_dir: Path, tmp_path: Path) -> None:
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, tmp_path)
    from_vocab = load_tokenizer(tmp_path)
    from_json = load_tokenizer(minilm_dir)
    assert from_vocab.vocab_size == from_json.vocab_size == 30522
    assert from_vocab.special_tokens == from_json.special_tokens
    for text in [*SENTENCES, "Héllo, WORLD!! unaffable 3.14 [SEP] inside", ""]:
        assert from_vocab.encode(text, add_bos=True, add_eos=True) == from_json.encode(text, add_bos=True, add_eos=True)
    assert from_json.encode("hello world") == [7592, 2088]  # no fixed padding to 128 from tokenizer.json
    assert from_json.decode(from_json.encode("Hello, world!", add_bos=True, add_eos=True)) == "hello, world!"
