"""Sentence vectors of an imported MiniLM equal sentence-transformers' (computed with transformers), in any batching."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from qkv.pretrained import (
    SentenceHead,
    embed_sentences,
    load_pretrained,
    read_sentence_head,
)
from qkv.pretrained.sentences import length_batches

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
]


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
