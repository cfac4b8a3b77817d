"""Character-level tokenizer: vocabulary layout, unknown characters, exact round trips."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.errors import QkvError
from qkv.tokenizers import SPECIAL_TOKENS, CharTokenizer, load_tokenizer

TEXT = "The quick brown fox jumps over the lazy dog.\nÜber 3 Füchse, 2 Hunde! 😀\t"
TOK = CharTokenizer.train(TEXT)
ALPHABET = sorted(set(TEXT))


def test_vocabulary_is_the_specials_then_the_sorted_characters() -> None:
    tok = CharTokenizer.train("hello")
    assert tok.vocab == [*SPECIAL_TOKENS, "e", "h", "l", "o"]
    assert tok.vocab_size == 8
    assert tok.encode("hole") == [5, 7, 6, 4]
    assert TOK.vocab[4:] == ALPHABET


def test_tokens_are_the_characters() -> None:
    assert TOK.tokens("fox 😀") == ["f", "o", "x", " ", "😀"]
    assert TOK.tokens("f#") == ["f", "<unk>"]


def test_unknown_characters_become_unk_and_show_as_unk() -> None:
    ids = TOK.encode("fox#")
    assert ids[-1] == TOK.unk_id == 3
    assert TOK.decode(ids) == "fox<unk>"
    # the special token's text is just characters: never the <pad> id
    assert TOK.encode("<pad>") == [3, *(TOK.token_to_id(c) for c in "pad"), 3]


@given(st.text(alphabet=ALPHABET))
def test_round_trip_over_the_training_alphabet(text: str) -> None:
    ids = TOK.encode(text)
    assert len(ids) == len(text)
    assert TOK.decode(ids) == text
    assert TOK.decode(TOK.encode(text, add_bos=True, add_eos=True)) == text


@given(st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"]))))
def test_encode_never_raises_and_ids_stay_in_range(text: str) -> None:
    ids = TOK.encode(text)
    assert len(ids) == len(text)
    assert all(0 <= i < TOK.vocab_size for i in ids)
    for c, i in zip(text, ids, strict=True):
        assert i == (TOK.unk_id if c not in ALPHABET else TOK.token_to_id(c))


@given(st.text(alphabet=st.characters(exclude_characters=ALPHABET), min_size=1))
def test_unseen_characters_all_map_to_unk(text: str) -> None:
    assert TOK.encode(text) == [TOK.unk_id] * len(text)


def test_vocab_size_keeps_the_most_frequent_characters() -> None:
    tok = CharTokenizer.train("aaaa bbb cc d", vocab_size=7)  # room for 3: "a", " " and "b"
    assert tok.vocab == [*SPECIAL_TOKENS, " ", "a", "b"]
    assert tok.decode(tok.encode("abcd")) == "ab<unk><unk>"
    with pytest.raises(QkvError, match="use at least 5"):
        CharTokenizer.train("abc", vocab_size=4)


def test_save_and_load_round_trip(tmp_path) -> None:
    TOK.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, CharTokenizer)
    assert loaded.vocab == TOK.vocab
    assert loaded.encode(TEXT) == TOK.encode(TEXT)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=30), min_size=1, max_size=4), st.one_of(st.none(), st.integers(5, 12)))
def test_vectorised_training_and_encoding_match_plain_python(texts: list[str], vocab_size: int | None) -> None:
    """The numpy paths (a bincount of code points, a lookup table) agree with counting and dict lookups."""
    counts = Counter("".join(texts))
    if not counts:
        return
    chars = sorted(counts)
    if vocab_size is not None:
        chars = sorted(sorted(chars, key=lambda c: (-counts[c], c))[: vocab_size - 4])
    tok = CharTokenizer.train(texts, vocab_size)
    assert tok.vocab == [*SPECIAL_TOKENS, *chars]
    probe = "".join(texts) + "\ud800\U0001f600z"  # a lone surrogate, an emoji, maybe unseen letters
    assert tok.encode(probe) == [tok.stoi.get(c, 3) for c in probe]
    assert tok.encode_array(probe).tolist() == tok.encode(probe)
