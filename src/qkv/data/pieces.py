"""Where a text may be cut without changing its tokens, and a stream of text cut into pieces there.

A corpus too large for memory is tokenized piece by piece: ``ids(text) = ids(piece_1) + ids(piece_2) + ...``
must hold exactly, or the shards would differ from a one-shot encoding. That holds at a cut just before
an ASCII whitespace character (space, tab, newline, carriage return) that follows a non-whitespace one,
for all three of qkv's tokenizers:

- char: every cut is safe;
- word (``\\w+|[^\\w\\s]``): no token contains whitespace, so none spans the cut;
- byte-level BPE: GPT-2's pre-tokenizer splits the text with
  ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`` before merging inside each
  pre-token. Every alternative either stops at whitespace or lies inside a run of it, and none looks
  behind, so a pre-token ends at the start of a whitespace run and the run splits the same way from
  there whether the text before it is present or not. (Python's ``\\s`` includes every character that the
  library's ``\\s`` does, so a Python ``\\S`` before the cut is never whitespace to the library.)

The tokenizer's training sees the same pre-tokens too, so a tokenizer trained on pieces equals one trained
on the whole text. Tests check both properties against the library on random texts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

SAFE_CUT = re.compile(r"(?<=\S)(?=[ \t\n\r])")
"""Positions where a text may be cut: before ASCII whitespace that follows a non-whitespace character."""

PIECE_CHARS = 1 << 20
"""Pieces are cut at the first safe position after about this many characters."""

MAX_PIECE_FACTOR = 16
"""A piece with no safe cut within ``MAX_PIECE_FACTOR * piece_chars`` characters (a text without spaces or
line breaks) is cut there anyway, so memory stays bounded; only such a forced cut can split a token."""


def cut_text(text: str, piece_chars: int = PIECE_CHARS) -> list[str]:
    """``text`` cut into pieces of about ``piece_chars`` characters at safe positions only (see the module): the
    text is in memory already, so a stretch without a safe position stays whole, however long, and the pieces'
    tokens are always the text's."""
    return [piece for piece, _ in cut_pieces([(text, len(text))], piece_chars, force=False)]


def cut_pieces(
    blocks: Iterable[tuple[str, int]],
    piece_chars: int = PIECE_CHARS,
    *,
    forced: list[int] | None = None,
    force: bool = True,
) -> Iterator[tuple[str, int]]:
    """Regroup a stream of text blocks into pieces cut at safe positions.

    ``blocks`` yields ``(text, position)``: consecutive parts of one long text, each with a number that
    says how far through the input the reader is after it (bytes read, for progress). Yields
    ``(piece, position)``; joined, the pieces are exactly the joined blocks. If ``forced`` is a list, the
    number of forced cuts (see :data:`MAX_PIECE_FACTOR`) is appended to it at the end; ``force=False`` makes
    none (the caller holds the text in memory anyway).
    """
    limit = piece_chars * MAX_PIECE_FACTOR
    buffer: list[str] = []
    size = 0  # characters in buffer
    n_forced = 0
    position = 0
    for text, position in blocks:
        if not text:
            continue
        buffer.append(text)
        size += len(text)
        while size > piece_chars:
            joined = "".join(buffer)
            cut = SAFE_CUT.search(joined, piece_chars)
            if cut is None:
                if size <= limit or not force:  # wait for more text
                    buffer = [joined]
                    break
                at, n_forced = limit, n_forced + 1
            else:
                at = cut.start()
            yield joined[:at], position
            rest = joined[at:]
            buffer, size = ([rest], len(rest)) if rest else ([], 0)
    if size:
        yield "".join(buffer), position
    if forced is not None:
        forced.append(n_forced)
