"""Prefetch: the value handed back is always make(key), made ahead when the key was expected."""

from __future__ import annotations

import threading

from qkv.data.prefetch import Prefetch


def test_hands_back_make_of_the_key_and_makes_the_next_one_ahead() -> None:
    calls: list[tuple[int, str]] = []

    def make(key: int) -> int:
        calls.append((key, threading.current_thread().name))
        return key * key

    prefetch = Prefetch(make)
    assert prefetch(3, 4) == 9  # nothing made ahead: made here
    assert prefetch(4, 5) == 16  # made ahead on the background thread
    assert prefetch(7, 8) == 49  # not the expected key: made again, here
    prefetch.close()
    made_ahead = [key for key, thread in calls if thread.startswith("qkv-prefetch")]
    assert calls[0] == (3, threading.current_thread().name)
    assert 4 in made_ahead and (7, threading.current_thread().name) in calls
    assert prefetch(2, 3) == 4  # usable again after close


def test_word2vec_batches_equal_with_and_without_prefetching() -> None:
    import numpy as np

    from qkv.data.word2vec import Word2VecBatches

    rng = np.random.default_rng(0)
    stream = np.append(rng.integers(1, 40, size=3000), 0)
    counts = np.bincount(stream, minlength=40)
    for arch in ("skipgram", "cbow"):
        batches = Word2VecBatches(stream, counts, separator=0, arch=arch, batch_words=200, seed=3)
        drawn = [batches.train_batch() for _ in range(5)]
        fresh = Word2VecBatches(stream, counts, separator=0, arch=arch, batch_words=200, seed=3)
        for position, batch in enumerate(drawn):
            direct = fresh.batch_at((position, 0, 1))
            for name in ("contexts", "owner", "centers", "negatives", "negative_mask"):
                assert getattr(batch, name).equal(getattr(direct, name)), (arch, position, name)
        assert batches.position == 5
