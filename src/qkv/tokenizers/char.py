"""Character-level tokenizer: every character is one token.

The smallest "little pieces" (the GPT notes) a text can be broken into. The vocabulary is the four special
tokens followed by the sorted distinct characters of the training text, so with "hello" the ids are
``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, "e"=4, "h"=5, "l"=6, "o"=7, and each id indexes a row of
the embedding matrix W_E. Vocabularies stay tiny (tens of entries), which makes it the tokenizer of choice
for small models trained on CPU; the price is long sequences.

>>> tok = CharTokenizer.train("hello")
>>> tok.encode("hole")
[5, 7, 6, 4]
>>> tok.decode([5, 4, 6, 6, 7])
'hello'
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from qkv.errors import QkvError
from qkv.tokenizers.base import SPECIAL_TOKENS, ListVocabTokenizer, empty_corpus_error, iter_texts


class CharTokenizer(ListVocabTokenizer):
    """One token per character. Characters never seen in training become ``<unk>`` (id 3)."""

    kind = "char"

    @classmethod
    def train(cls, texts: str | Iterable[str], vocab_size: int | None = None) -> CharTokenizer:
        """Build the vocabulary from ``texts`` (one string or several).

        With ``vocab_size`` (special tokens included), only the most frequent characters are kept; the
        rest will encode as ``<unk>``.
        """
        counts = np.zeros(0, dtype=np.int64)  # counts[code point]: one bincount per text, no Python loop
        for text in iter_texts(texts):
            codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
            if codes.size:
                found = np.bincount(codes)
                if len(found) > len(counts):
                    counts = np.pad(counts, (0, len(found) - len(counts)))
                counts[: len(found)] += found
        present = np.flatnonzero(counts)
        if not present.size:
            raise empty_corpus_error()
        chars = [chr(c) for c in present.tolist()]  # sorted by code point
        if vocab_size is not None:
            if vocab_size <= len(SPECIAL_TOKENS):
                raise QkvError(
                    f"vocab_size {vocab_size} leaves no room for characters next to the "
                    f"{len(SPECIAL_TOKENS)} special tokens: use at least {len(SPECIAL_TOKENS) + 1}"
                )
            by_frequency = sorted(chars, key=lambda c: (-counts[ord(c)], c))
            chars = sorted(by_frequency[: vocab_size - len(SPECIAL_TOKENS)])
        return cls([*SPECIAL_TOKENS, *chars])

    def _encode_ids(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        return self._encode_ids(text), [(i, i + 1) for i in range(len(text))]  # one token per character

    def encode_array(self, text: str) -> np.ndarray:
        """The ids of ``text`` as an int64 array: one table lookup per code point (no Python loop)."""
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype="<u4")
        table = self._id_table()
        return table[np.minimum(codes, len(table) - 1)]

    def _id_table(self) -> np.ndarray:
        """``table[code point]`` = its id; the last entry, and every code point past it, is <unk>."""
        table = getattr(self, "_table", None)
        if table is None:
            chars = {ord(token): i for i, token in enumerate(self.vocab) if len(token) == 1}
            table = np.full(max(chars, default=0) + 2, self.stoi["<unk>"], dtype=np.int64)
            table[list(chars)] = list(chars.values())
            self._table = table
        return table

    def _decode_ids(self, ids: list[int]) -> str:
        return "".join(self.vocab[i] for i in ids)
