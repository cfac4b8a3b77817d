"""Training rows for Word2Vec, made from a stream of word ids the way word2vec and gensim make them.

The corpus is one stream of word ids in which a separator id ends each sentence (a line of the text);
windows never cross it. :func:`word_stream` makes that stream from text and a word tokenizer; any other
source of ids (such as prepared token shards) can be given to :class:`Word2VecBatches` directly.

Each training step takes the next ``batch_words`` words of the stream and, with a random generator seeded
by (seed, step), so that a resumed run draws exactly the same rows:

1. **drops frequent words** (subsampling): word w with count c(w) is kept with probability
   ``(sqrt(c / t) + 1) * t / c``, where t = ``sample`` x (number of words); gensim's formula, which is the
   word2vec C code's. "the" is mostly dropped, rare words always kept;
2. **draws a reduced window** b in 1..``window`` for every kept word, uniformly (so nearer words count
   more, as in the C code and gensim), and pairs the word with the kept words at most b positions away
   in its sentence;
3. **draws negative words** from the unigram distribution raised to 3/4, P(w) ~ c(w)^0.75, which favours
   rare words more than their counts would;
4. arranges the pairs as rows of a :class:`~qkv.models.word2vec.Word2VecBatch`: for skip-gram one row
   per (centre, context) pair (the context word's vector predicts the centre word, as in gensim); for
   CBOW one row per centre word, whose context words' vectors are averaged.

Consecutive rows are cut into blocks that share their negative words. For skip-gram a block holds the
pairs of one or two centre words (Ji et al.'s sharing). For CBOW the rows are shuffled first (``shuffle``):
neighbouring centre words share most of their context words, so a block of neighbours would push the same
context vectors away from the same negatives several times in one step (what that cost in analogy accuracy:
docs/word2vec.md, "CBOW's blocks").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from qkv.data.prefetch import Prefetch
from qkv.errors import QkvError
from qkv.models.word2vec import Word2VecBatch
from qkv.tokenizers import Tokenizer
from qkv.tokenizers.base import SPECIAL_TOKENS

ARCHS = ("skipgram", "cbow")
MAX_WINDOW = 1_000
"""The widest ``window`` taken (word2vec uses 5 to 10): wider ones only cost time and memory."""
MAX_NEGATIVE = 1_000
"""The most negative words per row taken (word2vec uses 5 to 20; 2 to 5 on large corpora)."""
BATCH_MEMORY_SHARE = 0.25
"""The share of the machine's available memory one batch may take (two are in memory at once: one made
ahead on another thread)."""
EVAL_SEED = 4321
"""Seed of the fixed evaluation rows: every evaluation of every run sees the same ones."""


def word_stream(lines: Iterable[str], tokenizer: Tokenizer) -> np.ndarray:
    """The ids of every line's words, each line followed by the tokenizer's ``<eos>`` id (the separator).

    Words outside the vocabulary (``<unk>``, the words below the minimum count) are dropped, not replaced,
    so they neither occupy window positions nor get trained (as gensim does)."""
    unk, separator = tokenizer.unk_id, tokenizer.eos_id
    assert separator is not None, "a word tokenizer has <eos>, the separator"
    pieces: list[np.ndarray] = []
    for line in lines:
        ids = np.asarray(tokenizer.encode(line), dtype=np.int64)
        ids = ids[ids != unk]
        if ids.size:
            pieces.append(np.append(ids, separator))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def prepared_vocabulary(ids: np.ndarray, tokenizer: Tokenizer, min_count: int, vocab_size: int | None) -> list[str]:
    """The words of a prepared id stream seen at least ``min_count`` times, most frequent first (ties in
    alphabetical order, as :meth:`WordTokenizer.train` orders them), at most ``vocab_size`` entries with the
    special tokens; ``tokenizer`` is the one the stream was encoded with."""
    counts = np.bincount(np.asarray(ids, dtype=np.int64), minlength=tokenizer.vocab_size)
    special = set(SPECIAL_TOKENS)
    words = [(int(c), tokenizer.id_to_token(i)) for i, c in enumerate(counts) if c >= max(min_count, 1)]
    words = [(c, w) for c, w in words if w not in special]
    ordered = [w for _, w in sorted(words, key=lambda cw: (-cw[0], cw[1]))]
    if vocab_size is not None:
        ordered = ordered[: max(vocab_size - len(SPECIAL_TOKENS), 0)]
    return [*SPECIAL_TOKENS, *ordered]


def remap_stream(ids: np.ndarray, source: Tokenizer, target: Tokenizer) -> np.ndarray:
    """Ids encoded with ``source`` as ``target``'s ids; words ``target`` lacks (and the special tokens) are
    dropped, as :func:`word_stream` drops them. The result ends with ``target``'s separator (``<eos>``)."""
    special = set(SPECIAL_TOKENS)
    table = np.full(source.vocab_size, -1, dtype=np.int64)  # source id -> target id, -1: dropped
    for i in range(source.vocab_size):
        token = source.id_to_token(i)
        j = target.token_to_id(token)
        if j is not None and token not in special:
            table[i] = j
    mapped = table[np.asarray(ids, dtype=np.int64)]
    assert target.eos_id is not None, "a word tokenizer has <eos>, the separator"
    return np.append(mapped[mapped >= 0], target.eos_id)


def split_lines(text: str) -> Iterator[str]:
    """The lines of ``text`` that hold anything but whitespace (word2vec's sentences)."""
    return (line for line in text.splitlines() if line.strip())


def word_counts(stream: np.ndarray, vocab_size: int, separator: int) -> np.ndarray:
    """How often each id occurs in ``stream`` (vocab_size,), the separator not counted."""
    counts = np.bincount(np.asarray(stream, dtype=np.int64), minlength=vocab_size)
    counts[separator] = 0
    return counts


def keep_probabilities(counts: np.ndarray, sample: float) -> np.ndarray:
    """P(keep w) = (sqrt(c(w) / t) + 1) * t / c(w), at most 1, with t = sample x total count (gensim's
    ``sample``; 0 keeps every word). Ids that never occur get 1."""
    counts = np.asarray(counts, dtype=np.float64)
    if sample <= 0:
        return np.ones_like(counts)
    threshold = sample * counts.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = (np.sqrt(counts / threshold) + 1) * threshold / counts
    return np.where(counts > 0, np.minimum(keep, 1.0), 1.0)


def negative_table(counts: np.ndarray, exponent: float = 0.75) -> np.ndarray:
    """The cumulative distribution (vocab_size,) of P(w) ~ c(w)^exponent, for drawing negative words."""
    weights = np.asarray(counts, dtype=np.float64) ** exponent
    cumulative = np.cumsum(weights)
    return cumulative / cumulative[-1]


def batch_bytes(window: int, negative: int, batch_words: int, block: int = 8, arch: str = "skipgram") -> int:
    """About the memory one batch takes: ``batch_words`` x (``window`` + 1) (centre, context) pairs on average
    (the reduced window is uniform in 1..window, on both sides), each with its positions and ids (about 10
    int64); and per block of rows (a row per pair for skip-gram, per word for CBOW) ``negative`` ids (int64),
    their random draws (float64) and a mask (a bool per row)."""
    pairs = batch_words * (window + 1)
    blocks = -(-(pairs if arch == "skipgram" else batch_words) // block)
    return pairs * 80 + blocks * negative * (16 + block)


def check_batch_size(window: int, negative: int, batch_words: int, block: int = 8, arch: str = "skipgram") -> None:
    """QkvError for a ``window`` or ``negative`` outside their bounds, or a batch the machine cannot hold."""
    for name, value, bound, usual in (
        ("window", window, MAX_WINDOW, "5 to 10"),
        ("negative", negative, MAX_NEGATIVE, "5 to 20"),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            raise QkvError(f"--{name} must be a whole number from 1 to {bound:,}, got {value!r}: word2vec uses {usual}")
    from qkv.models.memory import GIB, available_memory

    need, free = batch_bytes(window, negative, batch_words, block, arch), available_memory("cpu")
    if free is not None and need > BATCH_MEMORY_SHARE * free:
        raise QkvError(
            f"a batch of --batch-size {batch_words:,} words with --window {window} and --negative {negative} needs "
            f"about {need / GIB:,.1f} GiB, more than a quarter of the {free / GIB:,.1f} GiB available: lower them"
        )


def window_pairs(sentence: np.ndarray, window: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """All (centre, context) positions with the context at most window[centre] away in the same sentence.

    ``sentence`` (n,) numbers each word's sentence, ``window`` (n,) each word's reduced window; returns two
    (pairs,) arrays of positions, sorted by centre (the contexts of one centre in order of distance)."""
    n = sentence.shape[0]
    centres, contexts = [], []
    for offset in range(1, min(int(window.max(initial=0)), n - 1) + 1):  # no pair is farther apart than n - 1
        left = np.arange(n - offset)  # position i; its neighbour i + offset
        same = sentence[:-offset] == sentence[offset:]
        right_of = same & (window[:-offset] >= offset)  # centre i, context i + offset
        left_of = same & (window[offset:] >= offset)  # centre i + offset, context i
        centres += [left[right_of], left[left_of] + offset]
        contexts += [left[right_of] + offset, left[left_of]]
    centre = np.concatenate(centres) if centres else np.zeros(0, dtype=np.int64)
    context = np.concatenate(contexts) if contexts else np.zeros(0, dtype=np.int64)
    order = np.argsort(centre, kind="stable")
    return centre[order], context[order]


class Word2VecBatches:
    """Batches of skip-gram or CBOW rows from a word-id stream; ``train_batch`` gives the next one.

    ``stream`` holds word ids and ``separator`` ids between sentences; ``counts`` (vocab_size,) are the
    words' corpus counts, which set the subsampling and the negative distribution.
    """

    def __init__(
        self,
        stream: np.ndarray,
        counts: np.ndarray,
        *,
        separator: int,
        arch: str = "skipgram",
        window: int = 5,
        negative: int = 5,
        sample: float = 1e-3,
        batch_words: int = 10_000,
        block: int = 8,
        shuffle: bool | None = None,
        seed: int = 0,
    ) -> None:
        if arch not in ARCHS:
            raise QkvError(f"--arch {arch!r} is not a Word2Vec architecture: choose skipgram or cbow")
        check_batch_size(window, negative, batch_words, block, arch)
        self.stream = np.asarray(stream)
        self.separator, self.arch, self.window, self.negative = separator, arch, window, negative
        self.batch_words, self.block, self.seed = batch_words, block, seed
        self.shuffle = arch == "cbow" if shuffle is None else shuffle
        self.keep = keep_probabilities(counts, sample)
        self.cumulative = negative_table(counts)
        words = np.flatnonzero(self.stream != separator)  # positions of the words
        self.n_words = int(words.shape[0])
        self.starts = np.append(words[::batch_words], self.stream.shape[0])  # chunk k: starts[k]..starts[k+1]
        self.position = 0  # training batches drawn so far (by this process)
        self._prefetch = Prefetch(self.batch_at)

    @property
    def n_chunks(self) -> int:
        """Batches per pass over the corpus (an epoch)."""
        return int(self.starts.shape[0] - 1)

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed, "n_words": self.n_words, "batch_words": self.batch_words}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue after the saved position; the corpus and batch size must be the ones it was saved with."""
        if (state.get("n_words"), state.get("batch_words")) != (self.n_words, self.batch_words):
            raise QkvError(
                "the checkpoint was made with a different corpus or --batch-size: resume with the original ones"
            )
        self.position, self.seed = int(state["position"]), int(state["seed"])
        self._prefetch.close()  # a batch made ahead with the old seed must not be used

    def train_batch(self, rank: int = 0, world_size: int = 1) -> Word2VecBatch:
        """The next batch (see :meth:`batch_at`); the one after it is made meanwhile on another thread."""
        key = (self.position, rank, world_size)
        batch = self._prefetch(key, (self.position + 1, rank, world_size))
        self.position += 1
        return batch

    def batch_at(self, key: tuple[int, int, int]) -> Word2VecBatch:
        """The batch at (position, rank, world_size): chunk (position x world_size + rank) mod n_chunks, rows
        drawn with seed (seed, position, rank). It depends on nothing else, so it can be made ahead."""
        position, rank, world_size = key
        chunk = (position * world_size + rank) % self.n_chunks
        return self.make_batch(chunk, np.random.default_rng([self.seed, position, rank]))

    def eval_batches(self, count: int) -> list[Word2VecBatch]:
        """``count`` fixed batches spread over the corpus, the same at every call."""
        chunks = np.unique(np.linspace(0, self.n_chunks - 1, num=min(count, self.n_chunks)).round().astype(int))
        return [self.make_batch(int(k), np.random.default_rng([EVAL_SEED, int(k)])) for k in chunks]

    def make_batch(self, chunk: int, rng: np.random.Generator) -> Word2VecBatch:
        """Subsample chunk ``chunk``, pair its words within random reduced windows, draw the negatives."""
        raw = np.asarray(self.stream[self.starts[chunk] : self.starts[chunk + 1]], dtype=np.int64)
        is_word = raw != self.separator
        sentence = np.cumsum(~is_word)[is_word]  # (n,) sentence number of each word
        words = raw[is_word]
        kept = rng.random(words.shape[0]) < self.keep[words]
        words, sentence = words[kept], sentence[kept]
        window = rng.integers(1, self.window + 1, size=words.shape[0])  # reduced window, uniform in 1..window
        centre, context = window_pairs(sentence, window)
        if self.arch == "skipgram":  # one row per pair: the context word predicts the centre word
            centers, contexts, owner = words[centre], words[context], np.arange(centre.shape[0])
        else:  # one row per centre word that has a context
            has_context = np.bincount(centre, minlength=words.shape[0]) > 0
            row_of = np.cumsum(has_context) - 1
            centers, contexts, owner = words[has_context], words[context], row_of[centre]
        n_rows = centers.shape[0]
        if self.shuffle:  # blocks of rows from all over the batch, not of neighbouring centre words
            order = rng.permutation(n_rows)
            rank = np.empty_like(order)
            rank[order] = np.arange(n_rows)
            centers, owner = centers[order], rank[owner]
            by_row = np.argsort(owner, kind="stable")  # contexts in row order (skip-gram: owner = arange)
            contexts, owner = contexts[by_row], owner[by_row]
        n_blocks = max(1, -(-n_rows // self.block))
        negatives = np.searchsorted(self.cumulative, rng.random((n_blocks, self.negative)), side="right")
        negatives = np.minimum(negatives, self.cumulative.shape[0] - 1)
        padded = np.full(n_blocks * self.block, -1, dtype=np.int64)
        padded[:n_rows] = centers
        mask = (negatives[:, None, :] != padded.reshape(n_blocks, self.block, 1)) & (padded >= 0).reshape(
            n_blocks, self.block, 1
        )  # (B, block, K): not padding, not the row's own centre word
        return Word2VecBatch(
            contexts=torch.from_numpy(contexts),
            owner=torch.from_numpy(owner),
            centers=torch.from_numpy(centers),
            negatives=torch.from_numpy(negatives),
            negative_mask=torch.from_numpy(mask),
            n_words=int(is_word.sum()),
        )
