"""encode(text, special=True): special tokens' strings become their one id (what a rendered chat template needs),
while the default keeps them text; encode_with_offsets gives each id's characters."""

from __future__ import annotations

import threading

import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

from qkv.tokenizers import BPETokenizer, CharTokenizer, HFTokenizer, WordTokenizer
from qkv.tokenizers.special import split_special

CORPUS = "the quick brown fox jumps over the lazy dog, <tags> and émojis 😀\n" * 30
TOKENIZERS = {
    "char": CharTokenizer.train(CORPUS),
    "word": WordTokenizer.train(CORPUS),
    "bpe": BPETokenizer.train(CORPUS, vocab_size=300),
}


def test_split_special_cuts_at_every_special_string_longest_first() -> None:
    specials = {"<a>": 1, "<ab>": 2, "<a><a>": 3}
    assert list(split_special("x<ab><a><a>y<a>", specials)) == [
        (0, "x", None), (1, "<ab>", 2), (5, "<a><a>", 3), (11, "y", None), (12, "<a>", 1)
    ]  # fmt: skip
    assert list(split_special("", specials)) == []
    assert list(split_special("plain", {})) == [(0, "plain", None)]


@pytest.mark.parametrize("kind", TOKENIZERS)
def test_specials_are_text_by_default_and_one_id_when_asked(kind) -> None:
    tok = TOKENIZERS[kind]
    text = "the fox<eos> jumps<bos>"
    assert tok.special_token_ids() == {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    plain, special = tok.encode(text), tok.encode(text, special=True)
    assert tok.eos_id not in plain and tok.bos_id not in plain  # as before: typed specials are text
    assert special == tok.encode("the fox") + [tok.eos_id] + tok.encode(" jumps") + [tok.bos_id]
    assert tok.encode(text, special=True, add_bos=True)[0] == tok.bos_id
    assert tok.tokens("<eos>", special=True) == ["<eos>"]
    assert tok.encode_batch([text, "<pad>"], special=True) == [special, [tok.pad_id]]


@pytest.mark.parametrize("kind", TOKENIZERS)
@given(text=st.text(alphabet=st.sampled_from(list("the fox<>eosbpad \né😀")), max_size=40))
def test_offsets_point_at_each_tokens_characters(kind, text) -> None:
    tok = TOKENIZERS[kind]
    for special in (False, True):
        ids, offsets = tok.encode_with_offsets(text, special=special)
        assert ids == tok.encode(text, special=special)
        assert len(offsets) == len(ids)
        assert all(0 <= a <= b <= len(text) for a, b in offsets)
        assert [a for a, _ in offsets] == sorted(a for a, _ in offsets)
        for i, (a, b) in zip(ids, offsets, strict=True):
            if i in tok.special_token_ids().values() and i != tok.unk_id:  # <unk> stands for unknown text
                assert text[a:b] == tok.id_to_token(i)
        if kind == "char":
            assert "".join(text[a:b] for a, b in offsets) == text


def chatml() -> tokenizers.Tokenizer:
    hf = BPETokenizer.train(CORPUS, vocab_size=300).hf
    hf.add_special_tokens([tokenizers.AddedToken("<|im_start|>", special=True, normalized=False)])
    return hf


def test_hf_matches_the_librarys_special_added_tokens_without_changing_the_default() -> None:
    tok = HFTokenizer(chatml(), {"eos": "<eos>"})
    start = tok.token_to_id("<|im_start|>")
    assert "<|im_start|>" in tok.special_token_ids()
    assert tok.encode("<|im_start|>the", special=True) == [start, *tok.encode("the")]
    assert start not in tok.encode("<|im_start|>the")
    assert tok.hf.encode_special_tokens is True  # the wrapped tokenizer is never switched (other threads use it)
    ids, offsets = tok.encode_with_offsets("<|im_start|>the fox", special=True)
    assert ids[0] == start and offsets[0] == (0, 12)
    tok.hf.add_special_tokens([tokenizers.AddedToken("<|im_end|>", special=True, normalized=False)])
    assert tok.encode("x<|im_end|>", special=True)[-1] == tok.token_to_id("<|im_end|>")  # the copy follows


def test_hf_special_encoding_is_safe_across_threads() -> None:
    tok = HFTokenizer(chatml(), {"eos": "<eos>"})
    text = "<|im_start|>the quick fox " * 20
    plain, special = tok.encode(text), tok.encode(text, special=True)
    wrong = []

    def work(flag: bool) -> None:
        for _ in range(200):
            if tok.encode(text, special=flag) != (special if flag else plain):
                wrong.append(flag)

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_hf_role_tokens_that_are_plain_vocabulary_entries_are_matched_too() -> None:
    """transformers registers bos/eos/... as special tokens even when tokenizer.json lists them as ordinary entries."""
    hf = tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "</s>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = HFTokenizer(hf, {"eos": "</s>", "unk": "[UNK]"})
    assert tok.special_token_ids() == {"</s>": 1, "[UNK]": 2}
    assert tok.encode("a</s>", special=True) == [0, 1]
    assert tok.encode("a</s>") == [0, 2, 2, 2]  # as text: pieces the vocabulary does not have
    assert tok.encode_with_offsets("a </s>", special=True) == ([0, 1], [(0, 1), (2, 6)])
    assert tok.hf.get_added_tokens_decoder() == {} and tok.vocab_size == 3  # the wrapped tokenizer is untouched
