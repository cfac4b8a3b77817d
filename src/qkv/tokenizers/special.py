"""Finding special tokens' strings in a text, for ``encode(text, special=True)``.

A chat template writes its markers as text ("<|im_start|>user\\n...<|im_end|>"); the model was trained on each
marker as one token, so a rendered template is cut at every special string before the pieces between them
are encoded as ordinary text::

    "<|im_start|>user\\nHi<|im_end|>"  ─▶  (0, "<|im_start|>", 1), (12, "user\\nHi", None), (19, "<|im_end|>", 2)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping


def split_special(text: str, specials: Mapping[str, int]) -> Iterator[tuple[int, str, int | None]]:
    """(start, piece, its id if the piece is one of ``specials``' strings, else None) for the pieces of ``text``,
    in order; where several special strings start at the same place, the longest wins."""
    specials = {s: i for s, i in specials.items() if s}
    if not specials:
        if text:
            yield 0, text, None
        return
    pattern = re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True) if s))
    at = 0
    for match in pattern.finditer(text):
        if match.start() > at:
            yield at, text[at : match.start()], None
        yield match.start(), match.group(), specials[match.group()]
        at = match.end()
    if at < len(text):
        yield at, text[at:], None


def encode_around_specials(
    text: str, specials: Mapping[str, int], encode: Callable[[str], tuple[list[int], list[tuple[int, int]]]]
) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids of ``text`` and each one's (start, end) characters: a special string is its one id, every piece
    between them goes through ``encode`` (ids and offsets within the piece)."""
    ids: list[int] = []
    offsets: list[tuple[int, int]] = []
    for start, piece, special_id in split_special(text, specials):
        if special_id is not None:
            ids.append(special_id)
            offsets.append((start, start + len(piece)))
            continue
        piece_ids, piece_offsets = encode(piece)
        ids += piece_ids
        offsets += [(start + a, start + b) for a, b in piece_offsets]
    return ids, offsets
