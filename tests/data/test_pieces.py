"""Cutting a text into pieces never changes its tokens, nor the tokenizer trained on it (checked against the
Hugging Face library's own encoding of the whole text), and pieces stream without losing a character."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from qkv.data import builtin_corpus
from qkv.data.pieces import MAX_PIECE_FACTOR, SAFE_CUT, cut_pieces, cut_text
from qkv.tokenizers import Tokenizer, train_tokenizer
from tests.data.test_lm import whitespace_bpe

PARTS = [
    "a",
    "Bc",
    "1",
    "23",
    ".",
    "'s",
    "'",
    " ",
    "  ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    " \n ",
    "é",
    "日本",
    "\u3000",
    "\x1c",
]


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    text = builtin_corpus()[:100_000] + "é日本\u3000\x1c"
    return {kind: train_tokenizer(kind, text, 400 if kind == "bpe" else None) for kind in ("char", "word", "bpe")}


def every_cut(text: str) -> list[str]:
    """The text cut at every safe position: the hardest case for the rule."""
    cuts = [0, *(m.start() for m in SAFE_CUT.finditer(text)), len(text)]
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(PARTS), max_size=40))
@example(["a", " ", "Bc"])  # " Bc" is one BPE pre-token: the cut must come before the space, not after it
@example(["a", "\r\n", "Bc"])  # no cut between "\r" and "\n"
@example(["a", "  ", "\n", "1"])
def test_cutting_at_every_safe_position_keeps_the_tokens(tokenizers: dict[str, Tokenizer], parts: list[str]) -> None:
    text = "".join(parts)
    pieces = every_cut(text)
    assert "".join(pieces) == text
    for tok in [*tokenizers.values(), whitespace_bpe()]:
        assert [i for piece in pieces for i in tok.encode(piece)] == tok.encode(text)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(PARTS), min_size=1, max_size=40))
def test_a_tokenizer_trained_on_pieces_equals_one_trained_on_the_whole_text(parts: list[str]) -> None:
    text = "".join(parts) * 3
    pieces = every_cut(text)
    for kind, size in (("char", None), ("word", None), ("bpe", 300)):
        if not text.strip() and kind == "word":
            continue
        options = {"min_freq": 1} if kind == "bpe" else {}  # learn merges even from a short text
        assert train_tokenizer(kind, pieces, size, **options) == train_tokenizer(kind, text, size, **options)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab \n\t", max_size=300), st.integers(1, 40), st.lists(st.integers(1, 50), min_size=1))
def test_pieces_stream_any_blocks_into_the_same_text(text: str, piece_chars: int, sizes: list[int]) -> None:
    blocks, at = [], 0
    while at < len(text):
        size = sizes[len(blocks) % len(sizes)]
        blocks.append((text[at : at + size], at + size))
        at += size
    forced: list[int] = []
    pieces = list(cut_pieces(blocks, piece_chars, forced=forced))
    assert "".join(p for p, _ in pieces) == text
    for piece, _ in pieces[:-1]:  # every cut is a safe one, or a forced one at the size limit
        assert len(piece) >= piece_chars
        assert len(piece) <= piece_chars * MAX_PIECE_FACTOR
    whole = [p for p, _ in cut_pieces([(text, len(text))], piece_chars)]
    assert [p for p, _ in pieces] == whole  # the blocks do not matter
    assert forced == [0] or len(text) > piece_chars * MAX_PIECE_FACTOR
    if forced == [0]:  # a text in memory is cut at the same safe places, and never elsewhere
        assert cut_text(text, piece_chars) == whole


def test_a_text_without_spaces_is_cut_at_the_size_limit() -> None:
    forced: list[int] = []
    pieces = [p for p, _ in cut_pieces([("x" * 1000, 1000)], 10, forced=forced)]
    assert "".join(pieces) == "x" * 1000
    assert max(map(len, pieces)) == 10 * MAX_PIECE_FACTOR and forced == [6]
    in_memory = cut_text("x" * 1000 + " y" * 20, 10)  # never forced: the x's stay one piece
    assert in_memory[0] == "x" * 1000 and "".join(in_memory[1:]) == " y" * 20


def test_positions_follow_the_blocks() -> None:
    blocks = [("one two ", 8), ("three four ", 19), ("five", 23)]
    assert list(cut_pieces(blocks, 5)) == [("one two", 8), (" three", 19), (" four", 19), (" five", 23)]
