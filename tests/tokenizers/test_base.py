"""The interface every tokenizer shares: special tokens, decode options, JSON save/load and its errors."""

from __future__ import annotations

import doctest
import json
import os

import pytest
import torch

import qkv.tokenizers
from qkv.errors import QkvError
from qkv.tokenizers import (
    SPECIAL_TOKENS,
    BPETokenizer,
    CharTokenizer,
    Tokenizer,
    WordTokenizer,
    base,
    char,
    load_tokenizer,
    train_tokenizer,
    word,
)

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Attention weighs every token against every other;\n"
    "the queries, keys and values are rows of Q, K and V. Softmax turns scores into weights.\n"
) * 8
KINDS = {"char": None, "word": None, "bpe": 300}
SAMPLES = ["The quick fox.", "queries and keys", "", "zebra ü 😀 <eos>", "Softmax\tturns\nscores"]


@pytest.fixture(scope="module", params=sorted(KINDS))
def tok(request: pytest.FixtureRequest) -> Tokenizer:
    return train_tokenizer(request.param, CORPUS, KINDS[request.param])


def test_special_tokens_are_the_first_four_ids(tok: Tokenizer) -> None:
    assert SPECIAL_TOKENS == ("<pad>", "<bos>", "<eos>", "<unk>")
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert [tok.id_to_token(i) for i in range(4)] == list(SPECIAL_TOKENS)
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert tok.token_to_id("definitely not a token") is None


def test_train_tokenizer_builds_the_asked_kind(tok: Tokenizer) -> None:
    expected = {"char": CharTokenizer, "word": WordTokenizer, "bpe": BPETokenizer}[tok.kind]
    assert type(tok) is expected
    assert repr(tok).startswith(expected.__name__)


def test_add_bos_and_add_eos_wrap_the_ids(tok: Tokenizer) -> None:
    ids = tok.encode("The fox")
    assert ids and all(i >= 4 for i in ids)
    assert tok.encode("The fox", add_bos=True) == [1, *ids]
    assert tok.encode("The fox", add_eos=True) == [*ids, 2]
    assert tok.encode("The fox", add_bos=True, add_eos=True) == [1, *ids, 2]
    assert tok.encode("", add_bos=True, add_eos=True) == [1, 2]


def test_skip_special_drops_pad_bos_eos_but_keeps_unk(tok: Tokenizer) -> None:
    ids = [1, *tok.encode("The fox"), 2, 0, 0]
    assert tok.decode(ids) == "The fox"
    shown = tok.decode(ids, skip_special=False)
    assert shown.startswith("<bos>") and "<eos>" in shown and shown.endswith("<pad>")
    assert "<unk>" in tok.decode([3, *tok.encode("fox")])


def test_decode_takes_lists_and_1d_tensors_only(tok: Tokenizer) -> None:
    ids = tok.encode("The lazy dog.", add_bos=True, add_eos=True)
    assert tok.decode(torch.tensor(ids)) == tok.decode(ids) == "The lazy dog."
    assert tok.decode_batch(torch.tensor([ids, ids])) == ["The lazy dog.", "The lazy dog."]
    assert tok.decode([torch.tensor(i) for i in ids]) == "The lazy dog."  # 0-d tensors are ints too
    with pytest.raises(QkvError, match="1-D tensor"):
        tok.decode(torch.tensor([ids, ids]))
    with pytest.raises(QkvError, match="must be integers"):
        tok.decode([1.5])  # type: ignore[list-item]


@pytest.mark.parametrize("bad", [-1, 10**6])
def test_decode_rejects_ids_outside_the_vocabulary(tok: Tokenizer, bad: int) -> None:
    with pytest.raises(QkvError, match=f"token id {bad} is outside"):
        tok.decode([4, bad])
    with pytest.raises(QkvError, match="outside"):
        tok.id_to_token(tok.vocab_size)


def test_encode_batch_and_tokens_agree_with_encode(tok: Tokenizer) -> None:
    assert tok.encode_batch(SAMPLES) == [tok.encode(s) for s in SAMPLES]
    assert tok.encode_batch(SAMPLES, add_bos=True) == [tok.encode(s, add_bos=True) for s in SAMPLES]
    for s in SAMPLES:
        assert len(tok.tokens(s)) == len(tok.encode(s))
    with pytest.raises(QkvError, match="takes a str"):
        tok.encode(b"bytes")  # type: ignore[arg-type]


def test_save_then_load_gives_an_equal_tokenizer(tok: Tokenizer, tmp_path) -> None:
    path = tmp_path / "run" / "tokenizer.json"  # the folder is created
    tok.save(path)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["kind"] == tok.kind and data["format_version"] == 1
    for loaded in (load_tokenizer(path), load_tokenizer(str(path)), load_tokenizer(path.parent), Tokenizer.load(path)):
        assert type(loaded) is type(tok)
        assert loaded == tok
        assert loaded.vocab_size == tok.vocab_size
        assert [loaded.id_to_token(i) for i in range(loaded.vocab_size)] == [
            tok.id_to_token(i) for i in range(tok.vocab_size)
        ]
        assert loaded.encode_batch(SAMPLES) == tok.encode_batch(SAMPLES)
    assert load_tokenizer(tok.to_dict()) == tok
    assert type(tok).load(path) == tok


def test_save_is_atomic_and_leaves_no_temp_files(tok: Tokenizer, tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    tok.save(path)
    tok.save(path)  # overwriting is fine
    assert os.listdir(tmp_path) == ["tokenizer.json"]
    assert path.stat().st_mode & 0o444 == 0o444  # readable by others, unlike a raw mkstemp file
    before = path.read_bytes()

    class Broken(type(tok)):  # type: ignore[misc]
        def to_dict(self):  # json.dump fails half-way through writing
            return {"kind": self.kind, "oops": object()}

    broken = Broken.__new__(Broken)
    broken.__dict__.update(tok.__dict__)
    with pytest.raises(TypeError):
        broken.save(path)
    assert os.listdir(tmp_path) == ["tokenizer.json"]
    assert path.read_bytes() == before  # the old file is untouched


def test_equality_compares_contents() -> None:
    a = CharTokenizer.train("abc")
    assert a == CharTokenizer.train("cab")
    assert a != CharTokenizer.train("abd")
    assert a != WordTokenizer.train("abc")


def test_loading_a_missing_file_fails_with_the_fix(tmp_path) -> None:
    with pytest.raises(QkvError, match=r"nope\.json does not exist: check the path"):
        load_tokenizer(tmp_path / "nope.json")
    with pytest.raises(QkvError, match="does not exist"):
        load_tokenizer(tmp_path)  # a folder without tokenizer.json


def test_loading_broken_json_names_the_line(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text('{\n "kind": "char",\n "vocab": [,\n}\n')
    with pytest.raises(QkvError, match=r"is not valid JSON \(line 3"):
        load_tokenizer(path)
    path.write_text("[1, 2]")
    with pytest.raises(QkvError, match="is not a JSON object"):
        load_tokenizer(path)


def test_loading_an_unknown_kind_lists_the_known_ones(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps({"kind": "sentencepiece", "format_version": 1}))
    with pytest.raises(QkvError, match=r"unknown tokenizer kind 'sentencepiece': expected one of \['bpe', 'char'"):
        load_tokenizer(path)
    with pytest.raises(QkvError, match="unknown tokenizer kind None"):
        load_tokenizer({"vocab": []})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "char", "format_version": 99, "vocab": list(SPECIAL_TOKENS)}, "format_version 99"),
        ({"kind": "char", "format_version": 1}, "no list of strings under 'vocab'"),
        ({"kind": "word", "format_version": 1, "vocab": ["a", "b"]}, "must start with the special tokens"),
        ({"kind": "word", "format_version": 1, "vocab": [*SPECIAL_TOKENS, "a", "a"]}, "lists a token twice"),
        ({"kind": "bpe", "format_version": 1, "tokenizer": {"model": 3}}, "'tokenizer' object is damaged"),
        ({"kind": "hf", "format_version": 1}, "has no 'tokenizer' object"),
    ],
)
def test_loading_damaged_contents_fails_cleanly(data: dict, message: str) -> None:
    with pytest.raises(QkvError, match=message):
        load_tokenizer(data)


def test_load_on_a_subclass_checks_the_kind(tmp_path) -> None:
    path = tmp_path / "tokenizer.json"
    WordTokenizer.train("a b c").save(path)
    with pytest.raises(QkvError, match="is a 'word' tokenizer, not CharTokenizer"):
        CharTokenizer.load(path)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("texts", ["", [], ["", ""]])
def test_training_on_empty_text_fails(kind: str, texts) -> None:
    with pytest.raises(QkvError, match="is empty: give a non-empty text"):
        train_tokenizer(kind, texts, KINDS[kind])


def test_train_tokenizer_rejects_unknown_kinds_and_bad_texts() -> None:
    with pytest.raises(QkvError, match=r"kind 'sentencepiece': choose one of \['bpe', 'char', 'word'\]"):
        train_tokenizer("sentencepiece", "abc")
    with pytest.raises(QkvError, match="HFTokenizer.from_file"):
        train_tokenizer("hf", "abc")
    with pytest.raises(QkvError, match="must be strings"):
        train_tokenizer("char", ["abc", 3])


def test_train_tokenizer_passes_options_on() -> None:
    assert train_tokenizer("word", "a a b", min_freq=2).vocab == [*SPECIAL_TOKENS, "a"]
    assert train_tokenizer("bpe", CORPUS, 300, min_freq=1000).vocab_size == 260  # no pair that frequent


def test_training_on_several_texts_equals_training_on_their_concatenation() -> None:
    parts = ["The quick ", "brown fox.\n", "Jumps!"]
    assert train_tokenizer("char", parts) == train_tokenizer("char", "".join(parts))
    assert train_tokenizer("word", iter(parts)) == train_tokenizer("word", "".join(parts))


@pytest.mark.parametrize("module", [qkv.tokenizers, base, char, word])
def test_docstring_examples_run(module) -> None:
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
