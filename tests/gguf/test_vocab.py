"""qkv tokenizers written as GGUF tokenizer metadata and read back: byte-level BPE (qkv's, SmolLM2's),
SentencePiece-style, qkv's character tokenizer; the word tokenizer refused in one line."""

from __future__ import annotations

import pytest
from tokenizers import Regex, pre_tokenizers

from qkv.errors import QkvError
from qkv.export.gguf import export_gguf
from qkv.gguf import read_gguf
from qkv.gguf.tokenizer import PRE_TOKENIZERS, byte_level_pre_tokenizer, tokenizer_from_gguf
from qkv.gguf.vocab import pre_tokenizer_name, tokenizer_metadata
from qkv.models import LlamaConfig
from qkv.models.llama import Llama
from qkv.pretrained.gguf import load_gguf
from qkv.tokenizers import CharTokenizer, WordTokenizer
from tests.gguf.test_tokenizer import UNICODE, sentencepiece_metadata
from tests.gguf_files import TEXT, need

SAMPLE = "To be,  or not\tto be:\nthat is the question. Ünïcödé 🙂"


def round_trip(tokenizer):
    return tokenizer_from_gguf(tokenizer_metadata(tokenizer))


def test_qkv_bpe(bpe):
    back = round_trip(bpe)
    assert back.encode(TEXT + UNICODE) == bpe.encode(TEXT + UNICODE)
    assert back.decode(back.encode(UNICODE)) == UNICODE
    assert (back.bos_id, back.eos_id, back.pad_id, back.unk_id) == (1, 2, 0, 3)


def test_smollm2_tokenizer(smollm2):
    original = tokenizer_from_gguf(read_gguf(smollm2).metadata)
    metadata = tokenizer_metadata(original)
    assert metadata["tokenizer.ggml.pre"] == "smollm" and len(metadata["tokenizer.ggml.merges"]) == 48900
    assert round_trip(original).encode(TEXT + UNICODE) == original.encode(TEXT + UNICODE)


def test_sentencepiece_style():
    original = tokenizer_from_gguf(sentencepiece_metadata())
    back = round_trip(original)
    for text in ("hello world! the weather", UNICODE):
        assert back.encode(text) == original.encode(text)
    assert back.hf.encode("the").ids[0] == 1  # add_bos_token kept


def test_char_tokenizer_through_a_file(tmp_path):
    """A character model: one "llama" token per character (the space stored as "▁"), no merges."""
    need("gguf")
    char = CharTokenizer.train(TEXT + SAMPLE)
    model = Llama(LlamaConfig(vocab_size=char.vocab_size, d_model=16, n_heads=2, n_layers=1, context_length=256))
    path = export_gguf(model, char, tmp_path / "char.gguf", gguf_type="f32")
    metadata = read_gguf(path).metadata
    assert metadata["tokenizer.ggml.model"] == "llama" and "▁" in metadata["tokenizer.ggml.tokens"]
    back = load_gguf(path).tokenizer
    for text in (SAMPLE, TEXT, "  to  be  "):
        assert back.encode(text) == char.encode(text), text
        assert back.decode(back.encode(text)) == text
    assert back.encode("To ¿be") == char.encode("To ¿be")  # an unknown character: <unk> in both
    assert (back.bos_id, back.eos_id, back.unk_id) == (char.bos_id, char.eos_id, char.unk_id)


def test_char_vocabulary_with_the_sentencepiece_space_is_refused():
    with pytest.raises(QkvError, match="reads as the space"):
        tokenizer_metadata(CharTokenizer.train("a ▁ b"))


def test_word_tokenizer_is_refused():
    with pytest.raises(QkvError, match="'word' tokenizer has no GGUF counterpart") as error:
        tokenizer_metadata(WordTokenizer.train("the quick brown fox"))
    assert "\n" not in str(error.value)


def test_pre_tokenizer_names():
    for name in PRE_TOKENIZERS:  # each builder is recognised as its own name, or as one with the same split
        assert PRE_TOKENIZERS[pre_tokenizer_name(_json(byte_level_pre_tokenizer(name)))] == PRE_TOKENIZERS[name]
    assert pre_tokenizer_name(_json(pre_tokenizers.ByteLevel(add_prefix_space=False))) == "gpt-2"
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    digits = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    assert pre_tokenizer_name(_json(digits)) == "smollm"
    other = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s"), "isolated"), byte_level])
    with pytest.raises(QkvError, match="none of llama.cpp's"):
        pre_tokenizer_name(_json(other))


def _json(pre) -> dict:
    import json

    return json.loads(pre.__getstate__())
