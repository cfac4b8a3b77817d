"""Word-level tokenizer: splitting, frequency-ordered vocabulary, unknown words, detokenisation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qkv.errors import QkvError
from qkv.tokenizers import SPECIAL_TOKENS, WordTokenizer, load_tokenizer
from qkv.tokenizers.word import detokenize

TEXT = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox doesn't!
She said, "don't stop" (twice) [really] and it's well-known: 3.14 is about 22/7, isn't it?
Über naïve café, 1,000 times. 'Quoted' words and the end."""
TOK = WordTokenizer.train(TEXT)
WORDS = [w for w in TOK.vocab[4:] if w.isalnum()]


def test_splits_words_and_single_punctuation_marks() -> None:
    assert TOK.tokens("The quick brown fox jumps.") == ["The", "quick", "brown", "fox", "jumps", "."]
    assert TOK.tokens("doesn't!?") == ["doesn", "'", "t", "!", "?"]
    assert TOK.tokens("  \n\t ") == []


def test_vocabulary_is_ordered_by_frequency_then_alphabetically() -> None:
    tok = WordTokenizer.train("b a c b a b . .")
    assert tok.vocab == [*SPECIAL_TOKENS, "b", ".", "a", "c"]  # 3x b; 2x "." and "a" (alphabetical); 1x c
    assert WordTokenizer.train("The the THE the").vocab[4:] == ["the", "THE", "The"]  # case is kept


def test_vocab_size_and_min_freq_cut_the_vocabulary() -> None:
    assert WordTokenizer.train("b a c b a b", vocab_size=6).vocab == [*SPECIAL_TOKENS, "b", "a"]
    assert WordTokenizer.train("b a c b a b", min_freq=3).vocab == [*SPECIAL_TOKENS, "b"]
    with pytest.raises(QkvError, match="use at least 5"):
        WordTokenizer.train("a b", vocab_size=4)
    with pytest.raises(QkvError, match="lower min_freq"):
        WordTokenizer.train("a b", min_freq=2)
    with pytest.raises(QkvError, match="only whitespace"):
        WordTokenizer.train(" \n\t")


def test_unknown_words_become_unk() -> None:
    ids = TOK.encode("The zebra jumps")
    assert ids[1] == TOK.unk_id == 3
    assert TOK.decode(ids) == "The <unk> jumps"
    assert TOK.tokens("The zebra") == ["The", "<unk>"]
    assert TOK.encode("<eos>") == [3, 3, 3]  # "<", "eos", ">": text never becomes a special id


@pytest.mark.parametrize(
    "text",
    [
        "The quick brown fox jumps.",
        "The dog sleeps; the fox doesn't!",
        "She said, \"don't stop\" (twice) [really] and it's well-known: 3.14 is about 22/7, isn't it?",
        "Über naïve café, 1,000 times.",
        "'Quoted' words and the end.",
    ],
)
def test_ordinary_text_round_trips(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text


def test_whitespace_is_normalised() -> None:
    assert TOK.decode(TOK.encode("The   quick\n\nbrown\tfox .")) == "The quick brown fox."
    assert TOK.decode(TOK.encode("( twice )")) == "(twice)"


def test_detokenize_spacing_rules() -> None:
    assert detokenize(["a", ",", "b", ".", "c", "!", "?"]) == "a, b. c!?"
    assert detokenize(["(", "a", ")", "[", "b", "]"]) == "(a) [b]"
    assert detokenize(["x", '"', "a", "b", '"', "y"]) == 'x "a b" y'
    assert detokenize(["don", "'", "t", ",", "'", "no", "'", "it", "'", "s"]) == "don't, 'no' it's"
    assert detokenize(["'", "I", "don", "'", "t", "'", "."]) == "'I don't'."
    assert detokenize(["1", ",", "000", ".", "5", ".", "x"]) == "1,000.5. x"
    assert detokenize(["<bos>", "a", "-", "b", "<eos>"]) == "<bos> a-b <eos>"
    assert detokenize([]) == ""


@given(st.lists(st.sampled_from(WORDS), max_size=30))
def test_known_words_joined_by_spaces_round_trip(words: list[str]) -> None:
    text = " ".join(words)
    ids = TOK.encode(text)
    assert ids == [TOK.token_to_id(w) for w in words]
    assert TOK.decode(ids) == text


@given(
    st.lists(
        st.tuples(st.sampled_from(TOK.vocab[4:]), st.text(alphabet=" \n\t", min_size=1, max_size=3)),
        max_size=30,
    )
)
def test_decode_then_encode_gives_the_same_ids(pieces: list[tuple[str, str]]) -> None:
    text = "".join(token + space for token, space in pieces)
    ids = TOK.encode(text)
    assert 3 not in ids
    assert TOK.encode(TOK.decode(ids)) == ids  # decoding only changes whitespace


@given(st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"]))))
def test_encode_never_raises_and_ids_stay_in_range(text: str) -> None:
    ids = TOK.encode(text, add_bos=True)
    assert ids[0] == TOK.bos_id
    assert all(0 <= i < TOK.vocab_size for i in ids)
    assert isinstance(TOK.decode(ids), str)


@given(st.from_regex(r"[a-z]{1,10}", fullmatch=True).filter(lambda w: w not in TOK.stoi))
def test_unknown_words_map_to_unk(word: str) -> None:
    assert TOK.encode(f"the {word} fox") == [TOK.token_to_id("the"), TOK.unk_id, TOK.token_to_id("fox")]


def test_save_and_load_round_trip(tmp_path) -> None:
    TOK.save(tmp_path / "words.json")
    loaded = load_tokenizer(tmp_path / "words.json")
    assert isinstance(loaded, WordTokenizer)
    assert loaded.vocab == TOK.vocab
    assert loaded.encode(TEXT) == TOK.encode(TEXT)
