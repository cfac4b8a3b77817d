"""Word2Vec's data: vocabulary and counts, subsampling and windows as gensim makes them; exact resume."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from qkv.data.word2vec import (
    Word2VecBatches,
    keep_probabilities,
    negative_table,
    prepared_vocabulary,
    remap_stream,
    split_lines,
    window_pairs,
    word_counts,
    word_stream,
)
from qkv.errors import QkvError
from qkv.tokenizers import WordTokenizer
from qkv.tokenizers.word import WORD_PATTERN
from qkv.training.config import TrainConfig
from qkv.training.tasks.word2vec import train_vocabulary, unigram_counts


def zipf_lines(n_lines: int = 400, seed: int = 0) -> list[str]:
    """Sentences of words w0..w199 drawn with Zipf-like frequencies: some frequent, many rare."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" for i in range(200)])
    p = 1 / np.arange(1, 201)
    p /= p.sum()
    return [" ".join(rng.choice(vocab, size=rng.integers(3, 15), p=p)) for _ in range(n_lines)]


def test_vocabulary_counts_and_subsampling_match_gensim() -> None:
    gensim = pytest.importorskip("gensim")
    lines = zipf_lines()
    config = TrainConfig.create(task="word2vec", min_count=3, sample=1e-2)
    tokenizer = train_vocabulary(lines, config)
    stream = word_stream(lines, tokenizer)
    ours = unigram_counts(stream, tokenizer)

    sentences = [WORD_PATTERN.findall(line) for line in lines]
    reference = gensim.models.Word2Vec(min_count=3, sample=1e-2, vector_size=4, workers=1)
    reference.build_vocab(sentences)
    wv = reference.wv
    assert ours == {w: wv.get_vecattr(w, "count") for w in wv.index_to_key}
    assert min(ours.values()) >= 3 and len(ours) < 200  # rare words were dropped

    counts = word_counts(stream, tokenizer.vocab_size, tokenizer.eos_id)
    keep = keep_probabilities(counts, 1e-2)
    theirs = np.array([wv.get_vecattr(w, "sample_int") / (2**32 - 1) for w in wv.index_to_key])
    mine = np.array([keep[tokenizer.token_to_id(w)] for w in wv.index_to_key])
    np.testing.assert_allclose(mine, theirs, atol=1e-7)
    assert mine.min() < 0.5 and mine.max() == 1.0  # frequent words dropped often, rare ones kept


def test_stream_drops_unknown_words_and_separates_lines() -> None:
    lines = ["a b a", "  ", "b c zzz a"]
    config = TrainConfig.create(task="word2vec", min_count=2)
    tokenizer = train_vocabulary(list(split_lines("\n".join(lines))), config)
    stream = word_stream(split_lines("\n".join(lines)), tokenizer)
    words = [tokenizer.id_to_token(i) for i in stream]
    assert words == ["a", "b", "a", "<eos>", "b", "a", "<eos>"]  # c and zzz are below --min-count


def test_window_pairs_are_every_pair_within_the_reduced_window() -> None:
    rng = np.random.default_rng(1)
    sentence = np.repeat([0, 1, 2], [7, 1, 9])
    window = rng.integers(1, 4, size=sentence.shape[0])
    centre, context = window_pairs(sentence, window)
    expected = {
        (i, j)
        for i, j in itertools.permutations(range(len(sentence)), 2)
        if sentence[i] == sentence[j] and abs(i - j) <= window[i]
    }
    got = list(zip(centre.tolist(), context.tolist(), strict=True))
    assert len(got) == len(set(got)) and set(got) == expected
    assert list(centre) == sorted(centre)


def test_negatives_follow_the_unigram_distribution_to_the_three_quarters() -> None:
    counts = np.array([0, 0, 0, 0, 1000, 100, 10, 1])
    batches = Word2VecBatches(
        np.array([4, 5, 6, 7, 2] * 4), counts, separator=2, sample=0, negative=5, batch_words=4, seed=3
    )
    drawn = np.concatenate([batches.train_batch().negatives.flatten().numpy() for _ in range(4000)])
    frequency = np.bincount(drawn, minlength=8) / drawn.size
    expected = counts**0.75 / (counts**0.75).sum()
    np.testing.assert_allclose(frequency, expected, atol=0.01)
    np.testing.assert_allclose(np.diff(negative_table(counts))[3:], expected[4:], atol=1e-12)


@pytest.mark.parametrize("arch", ["skipgram", "cbow"])
def test_rows_stay_in_their_sentence_and_resume_exactly(arch: str) -> None:
    # sentence k uses only words 10k..10k+9, so a row mixing two sentences would show
    rng = np.random.default_rng(0)
    pieces = [np.append(rng.integers(10 * k + 4, 10 * k + 14, size=rng.integers(2, 30)), 2) for k in range(40)]
    stream = np.concatenate(pieces)
    counts = np.bincount(stream, minlength=404)
    counts[2] = 0
    make = dict(separator=2, arch=arch, window=4, negative=3, sample=1e-2, batch_words=50, seed=7)
    batches = Word2VecBatches(stream, counts, **make)
    first = [batches.train_batch() for _ in range(5)]
    for batch in first:
        group = (batch.centers[batch.owner] - 4) // 10
        assert torch.equal((batch.contexts - 4) // 10, group)
        if arch == "skipgram":
            assert torch.equal(batch.owner, torch.arange(batch.n_rows))
    state = batches.state_dict()
    following = batches.train_batch()
    again = Word2VecBatches(stream, counts, **make)
    again.load_state_dict(state)
    resumed = again.train_batch()
    for name in resumed._tensor_names():
        assert torch.equal(getattr(resumed, name), getattr(following, name))
    with pytest.raises(QkvError, match="different corpus"):
        Word2VecBatches(stream[:-40], counts, **make).load_state_dict(state)


@pytest.mark.parametrize("min_count", [1, 3, 8])
def test_prepared_ids_give_the_vocabulary_and_stream_of_the_text(min_count: int) -> None:
    """Ids encoded with an all-words tokenizer (as ``qkv prepare --tokenizer word`` writes them) map onto the
    vocabulary and the words that the text itself gives, without the sentence breaks."""
    lines = zipf_lines()
    everything = WordTokenizer.train(lines)
    ids = np.concatenate([everything.encode(line) for line in lines])
    vocab = prepared_vocabulary(ids, everything, min_count, None)
    expected = WordTokenizer.train(lines, min_freq=min_count)
    assert WordTokenizer(vocab) == expected
    stream = word_stream(lines, expected)
    mapped = remap_stream(ids, everything, expected)
    assert np.array_equal(mapped[:-1], stream[stream != expected.eos_id]) and mapped[-1] == expected.eos_id
    assert len(prepared_vocabulary(ids, everything, min_count, 10)) == 10  # --vocab-size caps it, specials included
