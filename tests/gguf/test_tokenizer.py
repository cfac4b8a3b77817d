"""The tokenizer qkv builds from a GGUF file against transformers' tokenizer from the same file: the real
SmolLM2 file (byte-level BPE, pre-tokenizer "smollm") and a small SentencePiece-style file written here."""

from __future__ import annotations

import pytest

from qkv.gguf import read_gguf
from qkv.gguf.tokenizer import sentencepiece_merges, tokenizer_from_gguf
from qkv.pretrained.gguf import load_gguf
from tests.conftest import shared_corpus
from tests.gguf_files import need, random_tensors, transformers, write_file

UNICODE = (
    "Café, naïve façade — Ünïcödé! 東京は日本の首都です。北京欢迎你 😀🙂👍🏽 \n\nnew\tline\t\ttabs   three spaces "
    "  and 1234567 digits 3.14159, 2024-06-01; x=42 ends.\r\n  leading and trailing  "
)


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2):
    return tokenizer_from_gguf(read_gguf(smollm2).metadata)


def same_as_transformers(ours, theirs, text: str) -> None:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False, split_special_tokens=True)
    assert ours.decode(ids) == text == theirs.decode(ids)


def test_unicode_sample(smollm2_tokenizer, smollm2_hf_tokenizer):
    same_as_transformers(smollm2_tokenizer, smollm2_hf_tokenizer, UNICODE)


def test_tiny_shakespeare(smollm2_tokenizer, smollm2_hf_tokenizer):
    text = (shared_corpus("tinyshakespeare") / "input.txt").read_text(encoding="utf-8")[:20000]
    same_as_transformers(smollm2_tokenizer, smollm2_hf_tokenizer, text)


def test_roles_and_specials(smollm2_tokenizer, smollm2_hf_tokenizer):
    tok = smollm2_tokenizer
    assert (tok.bos_id, tok.eos_id, tok.unk_id, tok.pad_id) == (1, 2, 0, 2)
    assert tok.encode("<|im_start|>") != [1]  # typed text stays text (llama.cpp without parse_special)
    assert tok.encode("hi", add_bos=True, add_eos=True) == [1, *tok.encode("hi"), 2]
    # add_bos_token is false in this file: the library's own encode (with special tokens) adds nothing either
    assert tok.hf.encode("hi").ids == smollm2_hf_tokenizer.encode("hi") == tok.encode("hi")


PIECES = ["▁", "t", "h", "e", "a", "r", "o", "n", "w", "l", "d", "▁t", "he", "▁the", "er", "▁a", "on", "▁w", "or",
          "ld", "▁wor", "▁world", "▁he", "ll", "▁hell", "o!"]  # fmt: skip


def sentencepiece_metadata(prefix: bool = True) -> dict:
    specials = ["<unk>", "<s>", "</s>"]
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    tokens = specials + bytes_ + PIECES
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(PIECES))]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * len(PIECES),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": prefix,
        "tokenizer.ggml.add_bos_token": True,
    }


def sentencepiece_file(tmp_path, prefix: bool = True):
    """A llama file with a SentencePiece vocabulary (scores, byte fallback) and a tiny model."""
    meta = sentencepiece_metadata(prefix)
    d, vocab = 8, len(meta["tokenizer.ggml.tokens"])
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    parts = {"attn_norm": (d,), "attn_q": (d, d), "attn_k": (d, d), "attn_v": (d, d), "attn_output": (d, d),
             "ffn_norm": (d,), "ffn_gate": (16, d), "ffn_up": (16, d), "ffn_down": (d, 16)}  # fmt: skip
    shapes.update({f"blk.0.{part}.weight": shape for part, shape in parts.items()})
    hyper = {"llama.block_count": 1, "llama.context_length": 64, "llama.embedding_length": d,
             "llama.feed_forward_length": 16, "llama.attention.head_count": 2,
             "llama.attention.layer_norm_rms_epsilon": 1e-5}  # fmt: skip
    return write_file(tmp_path / "spm.gguf", "llama", {**hyper, **meta}, random_tensors(shapes))


def test_sentencepiece_file(tmp_path):
    """The SentencePiece file read by qkv and by transformers."""
    need("gguf")
    if transformers is None:
        pytest.skip("transformers is not installed")
    ours = load_gguf(sentencepiece_file(tmp_path)).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="spm.gguf")
    # transformers before 5.23 ignored the file's add_bos_token (seen with 5.17-5.22 on a GPU machine's image)
    reads_add_bos = tuple(int(part) for part in transformers.__version__.split(".")[:2]) >= (5, 23)
    for text in ["the world", "hello world!", " the  weather\nthere ütf 😀", "hell o!"]:
        ids = ours.encode(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
        assert ours.hf.encode(text).ids[0] == 1  # add_bos_token: <s> first, as llama.cpp reads the file
        if reads_add_bos:
            assert ours.hf.encode(text).ids == theirs.encode(text)  # and as transformers does
    assert ours.decode(ours.encode("the  weather\nthere ütf 😀")) == "the  weather\nthere ütf 😀"  # byte fallback


def test_no_space_prefix(tmp_path):
    """add_space_prefix=false: no "▁" before the text, as llama.cpp reads it (transformers' GGUF loading ignores the
    flag and always prefixes)."""
    need("gguf")
    tok = load_gguf(sentencepiece_file(tmp_path, prefix=False)).tokenizer
    assert tok.hf.encode("the world", add_special_tokens=False).tokens == ["t", "he", "▁world"]
    assert tok.decode(tok.encode("the world")) == "the world"


def test_sentencepiece_merges_rank_by_score():
    merges = sentencepiece_merges(["a", "b", "c", "ab", "bc", "abc"], [0, 0, 0, -2.0, -1.0, -0.5])
    assert merges == [("ab", "c"), ("a", "bc"), ("b", "c"), ("a", "b")]  # by score, then the longer left piece
