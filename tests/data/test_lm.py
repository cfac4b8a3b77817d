"""TokenBatches: a language model learns to predict token t+1 from tokens <= t, so y is x shifted by one."""

from __future__ import annotations

import io

import pytest
import tokenizers as hf_tokenizers
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers

from qkv.data import EVAL_SEED, TokenBatches, builtin_corpus, encode_corpus, load_corpus
from qkv.errors import QkvError
from qkv.tokenizers import SPECIAL_TOKENS, BPETokenizer, Tokenizer, train_tokenizer
from tests.conftest import shared_corpus

OFFSET = 7  # ids are OFFSET + position, so every id says where in the corpus it came from


def positional_ids(n: int) -> torch.Tensor:
    return torch.arange(n) + OFFSET


def starts_of(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] - OFFSET


def test_shapes_and_shift() -> None:
    data = TokenBatches(positional_ids(1000), context_length=16)
    x, y = data.train_batch(8)
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.long
    assert x.is_contiguous() and y.is_contiguous()  # y.view(-1) works in the loss
    assert torch.equal(x[:, 1:], y[:, :-1])
    expected = starts_of(x)[:, None] + torch.arange(17) + OFFSET  # each row is one window of T+1 ids
    assert torch.equal(x, expected[:, :-1]) and torch.equal(y, expected[:, 1:])


def test_split_sizes_follow_nanogpt() -> None:
    data = TokenBatches(positional_ids(1000), context_length=8)
    assert (data.n_train_tokens, data.n_val_tokens) == (900, 100)
    assert torch.equal(data.val_ids, positional_ids(1000)[900:])
    big = TokenBatches(torch.zeros(1_115_394, dtype=torch.long), context_length=256)
    assert (big.n_train_tokens, big.n_val_tokens) == (1_003_854, 111_540)  # tinyshakespeare's split


def test_train_windows_cover_the_training_split_and_never_touch_validation() -> None:
    data = TokenBatches(positional_ids(100), context_length=9)  # 90 train tokens: starts 0..80
    starts = torch.cat([starts_of(data.train_batch(64)[0]) for _ in range(50)])
    assert set(starts.tolist()) == set(range(81))
    x, y = data.train_batch(4096)
    assert int(y.max()) == 89 + OFFSET  # the last training token is a target; the first val token never is


def test_val_windows_lie_inside_the_validation_split() -> None:
    data = TokenBatches(positional_ids(200), context_length=10)  # val = positions 180..199: starts 0..9
    starts = torch.cat([starts_of(x) for x, _ in data.val_batches(20, 64)])
    assert set(starts.tolist()) == set(range(180, 190))
    train_x, _ = next(data.eval_batches("train", 1, 512))
    assert int(train_x.max()) < 180 + OFFSET


def test_ranks_see_the_rows_one_process_would_see() -> None:
    ids = torch.randint(0, 50, (5000,))
    single = TokenBatches(ids, context_length=12, seed=5)
    ranks = [TokenBatches(ids, context_length=12, seed=5) for _ in range(2)]
    for _ in range(3):  # the generators stay in step over several steps
        x, y = single.train_batch(6)
        parts = [r.train_batch(3, rank=i, world_size=2) for i, r in enumerate(ranks)]
        assert torch.equal(torch.cat([p[0] for p in parts]), x)
        assert torch.equal(torch.cat([p[1] for p in parts]), y)
    val_single = list(single.val_batches(2, 6))
    val_ranks = [list(single.val_batches(2, 3, rank=i, world_size=2)) for i in range(2)]
    for step in range(2):
        assert torch.equal(torch.cat([val_ranks[0][step][0], val_ranks[1][step][0]]), val_single[step][0])


def test_seeds_decide_the_batches() -> None:
    ids = torch.randint(0, 50, (5000,))
    a, b, c = (TokenBatches(ids, context_length=12, seed=s) for s in (1, 1, 2))
    xa, xb, xc = (d.train_batch(8)[0] for d in (a, b, c))
    assert torch.equal(xa, xb) and not torch.equal(xa, xc)
    assert not torch.equal(xa, a.train_batch(8)[0])  # the next batch is a new one


def test_state_dict_round_trip_resumes_exactly() -> None:
    ids = torch.randint(0, 50, (5000,))
    run = TokenBatches(ids, context_length=12, seed=3)
    run.train_batch(4)
    buffer = io.BytesIO()
    torch.save(run.state_dict(), buffer)
    following = [run.train_batch(4) for _ in range(3)]
    buffer.seek(0)
    resumed = TokenBatches(ids, context_length=12, seed=99)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.seed == 3
    for x, y in following:
        rx, ry = resumed.train_batch(4)
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_state_dict_from_other_data_is_refused() -> None:
    state = TokenBatches(torch.zeros(500, dtype=torch.long), context_length=12).state_dict()
    with pytest.raises(QkvError, match="saved batch state is for 450 training tokens and context_length 12, but"):
        TokenBatches(torch.zeros(600, dtype=torch.long), context_length=12).load_state_dict(state)
    with pytest.raises(QkvError, match="no generator state"):
        TokenBatches(torch.zeros(500, dtype=torch.long), context_length=12).load_state_dict({**state, "generator": 0})


def test_val_batches_are_the_same_every_call_and_leave_training_alone() -> None:
    ids = torch.randint(0, 50, (5000,))
    data, untouched = TokenBatches(ids, context_length=12), TokenBatches(ids, context_length=12)
    first, second = list(data.val_batches(3, 4)), list(data.val_batches(3, 4))
    assert len(first) == 3
    for (x1, y1), (x2, y2) in zip(first, second, strict=True):
        assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(first[0][0], first[1][0])
    assert torch.equal(data.train_batch(4)[0], untouched.train_batch(4)[0])
    other_seed = TokenBatches(ids, context_length=12, seed=42)  # evaluation windows do not depend on the seed
    assert torch.equal(next(other_seed.val_batches(1, 4))[0], first[0][0])
    assert isinstance(EVAL_SEED, int)


def test_small_corpus_errors_give_the_numbers() -> None:
    with pytest.raises(QkvError) as caught:
        TokenBatches(torch.zeros(30, dtype=torch.long), context_length=32)
    assert str(caught.value) == (
        "the corpus has 30 tokens: the training split (27 tokens) is shorter than one context window of "
        "context_length + 1 = 33 tokens: use a longer text, a smaller --context-length, or a smaller --val-fraction"
    )
    with pytest.raises(QkvError) as caught:
        TokenBatches(torch.zeros(40, dtype=torch.long), context_length=32)
    assert str(caught.value).startswith("the corpus has 40 tokens: the validation split (4 tokens) is shorter than")
    assert str(caught.value).endswith(
        "= 33 tokens: use a longer text, a smaller --context-length, or a larger "
        "--val-fraction (0 turns validation off)"
    )
    TokenBatches(torch.zeros(33, dtype=torch.long), context_length=32, val_fraction=0)  # exactly one window


def test_no_validation_split() -> None:
    data = TokenBatches(positional_ids(40), context_length=32, val_fraction=0)
    assert (data.n_train_tokens, data.n_val_tokens, data.has_validation) == (40, 0, False)
    assert int(data.train_batch(256)[1].max()) == 39 + OFFSET  # the whole corpus is training data
    with pytest.raises(QkvError, match="there is no validation split"):
        data.val_batches(1, 4)
    (x1, _), (x2, _) = next(data.fixed_train_batches(1, 4)), next(data.eval_batches("train", 1, 4))
    assert torch.equal(x1, x2)  # what to evaluate on instead: the same training windows every time


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ids": torch.zeros(2, 50, dtype=torch.long)}, "1-D integer tensor"),
        ({"ids": torch.zeros(50)}, "1-D integer tensor"),
        ({"context_length": 0}, "context_length must be a positive integer"),
        ({"val_fraction": 1.0}, "val_fraction must be at least 0 and below 1"),
        ({"val_fraction": -0.1}, "val_fraction must be at least 0 and below 1"),
    ],
)
def test_bad_arguments(kwargs: dict, message: str) -> None:
    args = {"ids": torch.zeros(500, dtype=torch.long), "context_length": 8, **kwargs}
    with pytest.raises(QkvError, match=message):
        TokenBatches(args.pop("ids"), args.pop("context_length"), **args)


def test_bad_batch_arguments() -> None:
    data = TokenBatches(list(range(500)), context_length=8)  # a plain list of ids works too
    with pytest.raises(QkvError, match="rank 2 is not below world_size 2"):
        data.train_batch(4, rank=2, world_size=2)
    with pytest.raises(QkvError, match="batch_size must be an integer of at least 1"):
        data.train_batch(0)
    with pytest.raises(QkvError, match="split must be 'train' or 'val'"):
        data.eval_batches("test", 1, 4)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    text = builtin_corpus()
    return {kind: train_tokenizer(kind, text) for kind in ("char", "word", "bpe")}


def test_from_text_equals_encode(tokenizers: dict[str, Tokenizer]) -> None:
    text = builtin_corpus()
    data = TokenBatches.from_text(text, tokenizers["char"], context_length=64)
    assert data.ids.tolist() == tokenizers["char"].encode(text)


@pytest.mark.parametrize("kind", ["char", "word", "bpe"])
def test_chunked_encoding_equals_one_encode(kind: str, tokenizers: dict[str, Tokenizer]) -> None:
    tok, text = tokenizers[kind], builtin_corpus()
    pieces: list[int] = []
    original = tok.encode_batch

    def spy(texts: list[str], **kw: bool) -> list[list[int]]:
        pieces.append(len(texts))
        return original(texts, **kw)

    tok.encode_batch = spy  # type: ignore[method-assign]
    try:
        ids = encode_corpus(text, tok, chunk_chars=5_000)
    finally:
        del tok.encode_batch
    assert pieces and pieces[0] > 50  # it really was cut into pieces
    assert ids.dtype == torch.long and ids.tolist() == tok.encode(text)


def whitespace_bpe() -> BPETokenizer:
    """A byte-level BPE with merges across newlines and spaces ("\\n\\n", " \\n", ...): qkv's trainer feeds
    lines and never learns them, but a loaded tokenizer may have them, and they are what a careless cut breaks.
    """
    merges = [("Ċ", "Ċ"), ("Ġ", "Ċ"), ("Ġ", "Ġ"), ("ĉ", "Ċ"), ("Ċ", "Ġ")]
    entries = [*SPECIAL_TOKENS, *sorted(pre_tokenizers.ByteLevel.alphabet()), *(a + b for a, b in merges)]
    hf = hf_tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(entries)}, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    return BPETokenizer(hf)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["a", "b1", ".", " ", "  ", "\n", "\n\n", "\t"]), max_size=60), st.integers(1, 20))
@example(["a", "\n\n", " ", "b1"], 1)  # "\n\n" is one piece before a space: a cut after the first "\n" splits it
@example(["a", " ", "\n", "b1"], 1)  # " \n" would become one piece at the end of a chunk
@example(["a"] + ["b1"] * 8, 1)  # no safe cut within 16 characters: the word stays whole (one <unk>)
def test_chunk_cuts_never_change_tokens(tokenizers: dict[str, Tokenizer], parts: list[str], chunk_chars: int) -> None:
    text = "".join(parts)
    for tok in [*tokenizers.values(), whitespace_bpe()]:
        assert encode_corpus(text, tok, chunk_chars=chunk_chars).tolist() == tok.encode(text)


def test_shared_tinyshakespeare_splits_like_nanogpt() -> None:
    text = load_corpus(shared_corpus("tinyshakespeare") / "input.txt").text
    tok = train_tokenizer("char", text)
    data = TokenBatches.from_text(text, tok, context_length=256)
    assert (data.n_train_tokens, data.n_val_tokens) == (1_003_854, 111_540)
    x, y = data.train_batch(4)
    assert tok.decode(x[0][1:]) == tok.decode(y[0][:-1])
