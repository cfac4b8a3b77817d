"""--target and --foil: exactly one token of the vocabulary, by its text or by its name."""

from __future__ import annotations

import pytest

from qkv.errors import QkvError
from qkv.inspect.answer import one_token
from tests.pretrained.conftest import gpt2_dir  # noqa: F401  (session fixture)


def test_one_character_or_a_named_special_token(char_tokenizer) -> None:
    assert one_token(char_tokenizer, "q") == char_tokenizer.encode("q")[0]
    assert one_token(char_tokenizer, "<eos>") == char_tokenizer.eos_id  # encodes to 5 characters, named in the vocab
    with pytest.raises(QkvError, match=r"--foil 'ox' is 2 tokens \('o', 'x'\), not one"):
        one_token(char_tokenizer, "ox", what="--foil")
    with pytest.raises(QkvError, match="--target is empty"):
        one_token(char_tokenizer, "")


def test_gpt2_words_are_tokens_with_their_leading_space(gpt2_dir) -> None:  # noqa: F811
    from qkv.loading import load

    tokenizer = load(str(gpt2_dir)).tokenizer
    assert one_token(tokenizer, " the") == tokenizer.encode(" the")[0]
    assert one_token(tokenizer, "<|endoftext|>") == tokenizer.eos_id
    with pytest.raises(QkvError, match=r"--target ' quick' is 3 tokens \('␣', 'qu', 'ick'\), not one"):
        one_token(tokenizer, " quick")
