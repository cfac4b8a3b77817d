"""BERT/MiniLM imported into qkv's Encoder: hidden states and real sentence embeddings equal Hugging Face's."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from qkv.models import Encoder
from qkv.pretrained import (
    SentenceHead,
    convert_bert,
    embed_sentences,
    load_pretrained,
    read_hf_config,
    read_hf_weights,
    read_sentence_head,
)
from qkv.pretrained.bert import length_batches, load_tokenizer

from .conftest import perturb

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


def test_minilm_sentence_embeddings_match_transformers(minilm_dir: Path) -> None:
    bundle = load_pretrained(minilm_dir)
    head = read_sentence_head(minilm_dir)
    assert head == SentenceHead(pooling="mean", normalize=True, max_tokens=256)  # modules.json lists Normalize
    ours = embed_sentences(bundle, SENTENCES)

    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    reference_model = transformers.AutoModel.from_pretrained(minilm_dir).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    for i, text in enumerate(SENTENCES):  # [CLS] ... [SEP], as BERT expects
        want = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert bundle.tokenizer.encode(text, add_bos=True, add_eos=True) == want
    with torch.no_grad():
        hidden = reference_model(**batch).last_hidden_state
    keep = batch["attention_mask"].unsqueeze(-1).float()
    reference = F.normalize((hidden * keep).sum(1) / keep.sum(1), dim=-1)  # mean pooling + Normalize

    cosine = F.cosine_similarity(ours, reference, dim=-1)
    print(f"MiniLM cosine to transformers: min {cosine.min().item():.7f}")
    assert cosine.min().item() >= 0.9999
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(SENTENCES)), atol=1e-5)

    scores = ours @ ours.T
    assert scores[0, 1] > 0.6  # eating food ~ eating bread
    assert scores[0, 1] > max(scores[0, 2], scores[0, 4], scores[0, 5]) + 0.3
    assert scores[0, 3] > scores[0, 2]  # a man doing something is nearer than a girl carrying a baby


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


def test_embed_sentences_truncates_long_texts(minilm_dir: Path) -> None:
    bundle = load_pretrained(minilm_dir)
    short = embed_sentences(bundle, ["word " * 10], head=SentenceHead(normalize=True, max_tokens=8))
    cut = embed_sentences(bundle, ["word " * 6], head=SentenceHead(normalize=True, max_tokens=8))
    torch.testing.assert_close(short, cut)  # both are [CLS] word x 6 [SEP]


def test_length_batches_cover_every_row_once_within_the_budget() -> None:
    lengths = [5, 30, 7, 7, 12, 3, 40, 6, 9, 11]
    batches = length_batches(lengths, max_batch_tokens=24)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= 24 or len(batch) == 1  # a row over the budget runs alone
    order = [lengths[i] for batch in batches for i in batch]
    assert order == sorted(lengths)  # similar lengths together: little padding


def test_embed_sentences_in_small_batches_equals_one_by_one_in_the_given_order(minilm_dir: Path) -> None:
    bundle = load_pretrained(minilm_dir)
    texts = [*SENTENCES, "Hi.", "A very long sentence about a man who walks his dog along the river every day."]
    batched = embed_sentences(bundle, texts, max_batch_tokens=40)  # several batches, sorted by length
    alone = torch.cat([embed_sentences(bundle, [text]) for text in texts])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)
    assert embed_sentences(bundle, []).shape == (0, 384)


def test_embed_sentences_needs_an_encoder(gpt2_dir: Path) -> None:
    from qkv.errors import QkvError

    with pytest.raises(QkvError, match="need an encoder"):
        embed_sentences(load_pretrained(gpt2_dir), ["hello"])
