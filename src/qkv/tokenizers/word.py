"""Word-level tokenizer: every word and every punctuation mark is one token.

This is the picture the GPT notes draw first ("The model has a predefined vocabulary (list of all
possible words)"; 004: "The quick brown fox jumps" is five tokens). Text is split with the regular
expression ``\\w+|[^\\w\\s]`` (runs of letters/digits/underscore, or a single punctuation mark), case is
kept, and the vocabulary is the four special tokens followed by the words ordered by frequency (ties in
alphabetical order). Each id indexes a row of the embedding matrix W_E; words outside the vocabulary
become ``<unk>`` (id 3).

Whitespace is normalised: ``decode`` joins tokens with single spaces, with no space before closing
punctuation (``. , ; : ! ? ) ] }`` and closing quotes), none after opening brackets and quotes, and none
around the apostrophe of a contraction ("don't", "it's") or a hyphen ("well-known"). So text written in the usual way
comes back unchanged, while newlines, tabs and runs of spaces come back as single spaces:

>>> tok = WordTokenizer.train("The quick brown fox jumps.")
>>> tok.decode(tok.encode("The quick brown fox jumps."))
'The quick brown fox jumps.'
>>> tok.decode(tok.encode("The  fox\\njumps ."))
'The fox jumps.'
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

from qkv.errors import QkvError
from qkv.tokenizers.base import SPECIAL_TOKENS, ListVocabTokenizer, empty_corpus_error, iter_texts

WORD_PATTERN = re.compile(r"\w+|[^\w\s]")
"""A token is a run of word characters or a single character that is neither a word character nor space."""

_CLOSING = set(".,;:!?)]}%…»”")  # no space before
_OPENING = set("([{¿¡«“‘")  # no space after
_JOINERS = set("-/–—")  # no space on either side: "well-known", "and/or"
_APOSTROPHES = set("'’")  # before a contraction ("don't", "it's") joins; otherwise a quote mark
_CONTRACTIONS = {"s", "t", "re", "ve", "ll", "d", "m"}  # what follows the apostrophe in "it's", "don't", ...
_NUMBER_MARKS = set(".,:")  # between digits joins: "3.14", "1,000", "12:30"
_QUOTES = set("\"'`")  # straight quotes alternate between opening and closing


def _is_word(token: str) -> bool:
    return bool(token) and (token[0].isalnum() or token[0] == "_")


def detokenize(tokens: list[str]) -> str:
    """Join word-level tokens into text with the spacing rules in this module's docstring."""
    pieces: list[str] = []
    open_quotes: set[str] = set()  # straight quote marks currently open
    glue_next = True  # no space before the next token (true at the start of the text)
    for k, token in enumerate(tokens):
        prev = tokens[k - 1] if k > 0 else ""
        nxt = tokens[k + 1] if k + 1 < len(tokens) else ""
        space, glue_next = not glue_next, False
        if token in _NUMBER_MARKS and prev[-1:].isdigit() and nxt[:1].isdigit():
            space, glue_next = False, True
        elif token in _APOSTROPHES and _is_word(prev) and nxt.lower() in _CONTRACTIONS:
            space, glue_next = False, True
        elif token in _CLOSING or token == "’":
            space = False
        elif token in _OPENING:
            glue_next = True
        elif token in _JOINERS:
            space, glue_next = False, True
        elif token in _QUOTES:
            if token in open_quotes:  # closing quote: attach to the word before it
                open_quotes.discard(token)
                space = False
            else:  # opening quote: attach to the word after it
                open_quotes.add(token)
                glue_next = True
        pieces.append(" " + token if space else token)
    return "".join(pieces)


class WordTokenizer(ListVocabTokenizer):
    """One token per word or punctuation mark; unknown words become ``<unk>``."""

    kind = "word"

    @classmethod
    def train(cls, texts: str | Iterable[str], vocab_size: int | None = None, min_freq: int = 1) -> WordTokenizer:
        """Count the words of ``texts`` and keep the most frequent ones.

        ``vocab_size`` counts the special tokens too (None keeps every word); words seen fewer than
        ``min_freq`` times are left out and will encode as ``<unk>``.
        """
        counts: Counter[str] = Counter()
        seen_text = False
        for text in iter_texts(texts):
            seen_text = seen_text or bool(text)
            counts.update(WORD_PATTERN.findall(text))
        if not seen_text:
            raise empty_corpus_error()
        if not counts:
            raise QkvError("the training text contains only whitespace: give a text with words in it")
        if vocab_size is not None and vocab_size <= len(SPECIAL_TOKENS):
            raise QkvError(
                f"vocab_size {vocab_size} leaves no room for words next to the {len(SPECIAL_TOKENS)} "
                f"special tokens: use at least {len(SPECIAL_TOKENS) + 1}"
            )
        words = [w for w, c in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0])) if c >= min_freq]
        if not words:
            raise QkvError(f"no word occurs at least min_freq={min_freq} times: lower min_freq")
        if vocab_size is not None:
            words = words[: vocab_size - len(SPECIAL_TOKENS)]
        return cls([*SPECIAL_TOKENS, *words])

    def _encode_ids(self, text: str) -> list[int]:
        unk = self.stoi["<unk>"]
        return [self.stoi.get(word, unk) for word in WORD_PATTERN.findall(text)]

    def _encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        unk, words = self.stoi["<unk>"], list(WORD_PATTERN.finditer(text))
        return [self.stoi.get(w.group(), unk) for w in words], [w.span() for w in words]

    def _decode_ids(self, ids: list[int]) -> str:
        return detokenize([self.vocab[i] for i in ids])
