"""Byte-level BPE trained by qkv, and HFTokenizer wrapping any Hugging Face tokenizer."""

from __future__ import annotations

import json

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import decoders, models, pre_tokenizers

from qkv.errors import QkvError
from qkv.tokenizers import SPECIAL_TOKENS, BPETokenizer, HFTokenizer, Tokenizer, load_tokenizer

PARAGRAPH = """\
The quick brown fox jumps over the lazy dog. Tokens are little pieces of information: words, parts of
words, punctuation. Every token has an id, and the id picks a row of the embedding matrix W_E.
Attention compares every query with every key; the scores are scaled by the square root of d_k and turned
into weights with a softmax. The weights mix the values. Multi-head attention runs several heads side by
side, concatenates their outputs and projects them with W_O. The decoder is masked so that a position only
attends to earlier positions; the encoder sees the whole sentence. Positional encodings add the order.
"""
CORPUS = PARAGRAPH * 6 + "Unicode too: naïve café, Füße, 東京, emoji 😀🚀, tabs\tand\nnewlines.\n"
TOK = BPETokenizer.train(CORPUS, vocab_size=400)
# Lone surrogates (category Cs) are not text: they cannot be encoded as UTF-8, so they cannot round-trip.
ANY_TEXT = st.text(alphabet=st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from("\n\t\r <>😀é東")))


def test_specials_are_ids_0_to_3_and_the_vocabulary_has_the_asked_size() -> None:
    assert [TOK.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert TOK.special_tokens == {"pad": "<pad>", "bos": "<bos>", "eos": "<eos>", "unk": "<unk>"}
    assert TOK.vocab_size == 400
    assert TOK.kind == "bpe"


def test_frequent_words_become_single_tokens() -> None:
    assert len(TOK.encode(" the")) == len(TOK.encode(" every")) == 1
    assert len(TOK.encode("The quick brown fox")) < len("The quick brown fox")


def test_tokens_are_readable_pieces() -> None:
    pieces = TOK.tokens("The quick brown fox jumps.")
    assert "".join(pieces) == "The quick brown fox jumps."
    assert " quick" in pieces or " qu" in pieces
    assert not any("Ġ" in p for p in pieces)
    assert TOK.id_to_token(TOK.encode(" the")[0]) == "Ġthe"  # the stored vocabulary entry is byte-level


@given(ANY_TEXT)
def test_any_text_round_trips_exactly(text: str) -> None:
    ids = TOK.encode(text)
    assert all(0 <= i < TOK.vocab_size for i in ids)
    assert TOK.decode(ids) == text
    assert TOK.decode(TOK.encode(text, add_bos=True, add_eos=True)) == text


@given(st.text(alphabet=st.one_of(st.characters(), st.characters(categories=["Cs"]))))
def test_encode_never_raises_even_on_lone_surrogates(text: str) -> None:
    ids = TOK.encode(text)
    assert all(4 <= i < TOK.vocab_size for i in ids)  # plain text never yields a special id
    assert TOK.encode_batch([text, "fox"]) == [ids, TOK.encode("fox")]


@pytest.mark.parametrize("text", ["<eos>", "a <pad> b", "<bos><unk>"])
def test_special_token_text_is_spelled_out_not_matched(text: str) -> None:
    ids = TOK.encode(text)
    assert not set(ids) & {0, 1, 2, 3}
    assert TOK.decode(ids) == text


def test_encode_batch_matches_encode() -> None:
    texts = ["The fox.", "", "東京 😀", "attention\n"]
    assert TOK.encode_batch(texts) == [TOK.encode(t) for t in texts]
    assert TOK.encode_batch(texts, add_bos=True, add_eos=True) == [
        TOK.encode(t, add_bos=True, add_eos=True) for t in texts
    ]
    with pytest.raises(QkvError, match="list of str"):
        TOK.encode_batch(["ok", 3])  # type: ignore[list-item]


def test_decode_rejects_ids_beyond_the_vocabulary() -> None:
    with pytest.raises(QkvError, match="token id 400 is outside this tokenizer's vocabulary"):
        TOK.decode([5, 400])


def test_vocab_size_below_the_byte_alphabet_is_refused() -> None:
    with pytest.raises(QkvError, match="use at least 260"):
        BPETokenizer.train(CORPUS, vocab_size=259)
    assert BPETokenizer.train("abc", vocab_size=260).vocab_size == 260  # bytes and specials, no merges


def test_training_takes_several_texts() -> None:
    tok = BPETokenizer.train(CORPUS.splitlines(keepends=True), vocab_size=400)
    assert tok.vocab_size == 400
    assert tok.decode(tok.encode(CORPUS)) == CORPUS


def test_save_and_load_round_trip(tmp_path) -> None:
    TOK.save(tmp_path / "tokenizer.json")
    data = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    assert data["kind"] == "bpe"
    assert data["tokenizer"]["model"]["type"] == "BPE"  # the library's own JSON, nested
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, BPETokenizer)
    assert loaded == TOK
    assert loaded.hf.get_vocab() == TOK.hf.get_vocab()
    assert loaded.encode(CORPUS) == TOK.encode(CORPUS)
    assert loaded.encode("<eos>") == TOK.encode("<eos>")  # split_special_tokens survives loading


def test_bpe_needs_the_specials_at_ids_0_to_3() -> None:
    hf = tokenizers.Tokenizer(models.BPE(vocab={"a": 0, "<pad>": 1}, merges=[]))
    with pytest.raises(QkvError, match="as ids 0..3"):
        BPETokenizer(hf)


# ------------------------------------------------------------------------------------- HFTokenizer

BERT_SPECIALS = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}


def wordpiece() -> tokenizers.Tokenizer:
    """A tiny BERT-style WordPiece tokenizer with BERT's special-token names."""
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "quick", "brown", "fox", "jump", "##s", "##ed", "."]
    hf = tokenizers.Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece()
    hf.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])
    return hf


def gpt2_like() -> tokenizers.Tokenizer:
    """A tiny GPT-2-style byte-level BPE whose only special token is <|endoftext|>."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    vocab["Ġt"] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    hf = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    return hf


def test_hf_wordpiece_with_its_own_special_names(tmp_path) -> None:
    tok = HFTokenizer(wordpiece(), BERT_SPECIALS)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    ids = tok.encode("the quick fox jumps.", add_bos=True, add_eos=True)
    assert ids == [2, 4, 5, 7, 8, 9, 11, 3]
    assert tok.tokens("the fox jumped") == ["the", "fox", "jump", "##ed"]
    assert tok.encode("the zebra") == [4, 1]
    assert tok.decode(ids) == "the quick fox jumps."
    assert tok.decode(ids, skip_special=False).startswith("[CLS] the")
    assert tok.decode([4, 1]) == "the [UNK]"  # unk is shown

    tok.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert type(loaded) is HFTokenizer and loaded.kind == "hf"
    assert loaded == tok
    assert loaded.special_tokens == BERT_SPECIALS
    assert loaded.encode("the quick brown fox jumped.") == tok.encode("the quick brown fox jumped.")


def test_hf_gpt2_style_with_missing_roles(tmp_path) -> None:
    eot = "<|endoftext|>"
    tok = HFTokenizer(gpt2_like(), {"bos": eot, "eos": eot})
    assert tok.pad_id is None and tok.unk_id is None
    assert tok.bos_id == tok.eos_id == tok.vocab_size - 1
    text = "to the top 😀"
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == ids[-1] == tok.eos_id
    assert tok.decode(ids) == text
    assert tok.tokens(" t") == [" t"]
    assert eot not in tok.tokens(f"a{eot}b")  # text is text ...
    matched = HFTokenizer(gpt2_like(), {"eos": eot}, split_special_tokens=False)
    assert tok.eos_id in matched.encode(f"a{eot}b")  # ... unless asked otherwise
    with pytest.raises(QkvError, match="has no eos token: give it one in special_tokens"):
        HFTokenizer(gpt2_like(), {}).encode("a", add_bos=False, add_eos=True)

    tok.save(tmp_path / "gpt2.json")
    data = json.loads((tmp_path / "gpt2.json").read_text(encoding="utf-8"))
    assert data["special_tokens"] == {"pad": None, "bos": eot, "eos": eot, "unk": None}
    loaded = Tokenizer.load(tmp_path / "gpt2.json")
    assert loaded == tok and loaded.pad_id is None
    assert load_tokenizer(matched.to_dict()).encode(f"a{eot}b") == matched.encode(f"a{eot}b")


def test_hf_from_file_wraps_a_tokenizer_json(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    wordpiece().save(str(path))  # the library's own format
    tok = HFTokenizer.from_file(path, special_tokens=BERT_SPECIALS)
    assert tok == HFTokenizer(wordpiece(), BERT_SPECIALS)
    with pytest.raises(QkvError, match="does not exist"):
        HFTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"kind": "char"}')
    with pytest.raises(QkvError, match="is not a Hugging Face tokenizer.json"):
        HFTokenizer.from_file(tmp_path / "bad.json")


def test_hf_rejects_unknown_roles_and_tokens() -> None:
    with pytest.raises(QkvError, match=r"unknown special-token roles \['cls'\]"):
        HFTokenizer(wordpiece(), {"cls": "[CLS]"})
    with pytest.raises(QkvError, match=r"special token '<s>' \(role 'bos'\) is not in the tokenizer's vocab"):
        HFTokenizer(wordpiece(), {"bos": "<s>"})
