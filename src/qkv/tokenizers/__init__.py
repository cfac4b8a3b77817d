"""Tokenizers: text ─▶ tokens ─▶ ids (rows of the embedding matrix W_E), and back.

Three tokenizers qkv trains itself, from the smallest "little pieces" (the GPT notes) to the ones real GPTs
use, plus a wrapper for pretrained Hugging Face ``tokenizer.json`` files:

- :class:`CharTokenizer` (``"char"``): one token per character; tiny vocabulary, long sequences.
- :class:`WordTokenizer` (``"word"``): one token per word or punctuation mark, as in the sources' examples.
- :class:`BPETokenizer` (``"bpe"``): byte-level BPE subwords; any text round-trips exactly.
- :class:`HFTokenizer` (``"hf"``): any ``tokenizers.Tokenizer`` (GPT-2 BPE, BERT WordPiece, ...).

>>> from qkv.tokenizers import train_tokenizer, load_tokenizer
>>> tok = train_tokenizer("word", "The quick brown fox jumps over the lazy dog.")
>>> tok.encode("The lazy fox.", add_bos=True)
[1, 5, 10, 8, 4]
>>> tok.save("runs/demo/tokenizer.json")  # doctest: +SKIP
>>> load_tokenizer("runs/demo/tokenizer.json") == tok  # doctest: +SKIP
True
"""

from qkv.tokenizers.base import SPECIAL_TOKENS, Tokenizer, load_tokenizer, train_tokenizer
from qkv.tokenizers.bpe import BPETokenizer, HFTokenizer
from qkv.tokenizers.char import CharTokenizer
from qkv.tokenizers.word import WordTokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "BPETokenizer",
    "CharTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "WordTokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
