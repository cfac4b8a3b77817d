"""Text the tokenizer does not know: how many of its tokens became ``<unk>``, and which pieces they were.

A word or character missing from the vocabulary is encoded as ``<unk>`` (id 3 for qkv's own tokenizers), so the
model sees the same row of W_E for all of them and a score or a continuation says nothing about what was there.
:func:`unknown_note` is the one line every verb (and the server's ``X-Qkv-Note`` header) tells the user then.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from qkv.tokenizers.base import Tokenizer


def count_unknown(tokenizer: Tokenizer, text: str, ids: list[int] | None = None) -> tuple[int, int]:
    """How many of the tokens of ``text`` are ``<unk>`` (characters or words the tokenizer never saw), and
    how many tokens there are; ``ids``: the text's ids when the caller has them already (no second
    encoding). (0, n) for a tokenizer without ``<unk>``, such as byte-level BPE."""
    ids = tokenizer.encode(text) if ids is None else ids
    unk = tokenizer.unk_id
    return (0 if unk is None else sum(i == unk for i in ids)), len(ids)


def unknown_note(
    tokenizer: Tokenizer,
    text: str | Sequence[str],
    what: str = "the text",
    ids: list[int] | None = None,
    *,
    readable: bool = False,
) -> str | None:
    """One line for the user when ``text`` has tokens the tokenizer does not know (else None): the model sees
    <unk> in their place, so a score or a continuation says nothing about them. It names the first unknown
    pieces: as written with ``readable`` (a terminal), else escaped to ASCII ('\\u2603'), which an HTTP header
    can carry. ``ids``: as for :func:`count_unknown`. A list of texts (sentences) is counted text by text, so the
    line breaks between them are not counted as characters the vocabulary lacks."""
    texts = [text] if isinstance(text, str) else list(text)
    counts = [count_unknown(tokenizer, one, ids if isinstance(text, str) else None) for one in texts]
    unknown, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
    if not unknown:
        return None
    every = "all" if unknown == total else f"{unknown} of"
    pieces = list(dict.fromkeys(p for one in texts for p in unknown_pieces(tokenizer, one, _NAMED + 1)))
    more = ", ..." if len(pieces) > _NAMED else ""
    show = repr if readable else ascii
    named = f" ({', '.join(show(p) for p in pieces[:_NAMED])}{more})" if pieces else ""
    return (
        f"note: {every} {total} tokens of {what} became <unk>{named}, not in the tokenizer's vocabulary (learnt "
        "from the training data): the model sees <unk> in their place"
    )


_NAMED = 5  # unknown pieces a note names at most
_PIECES = re.compile(r"\w+|[^\w\s]|\s")  # words, punctuation marks and single spaces: the word tokenizer's split


def unknown_pieces(tokenizer: Tokenizer, text: str, limit: int = _NAMED) -> list[str]:
    """The first ``limit`` distinct pieces of ``text`` that become <unk>: characters for a tokenizer with a token
    per character, else words or punctuation marks (each distinct piece encoded once)."""
    unk = tokenizer.unk_id
    found: list[str] = []
    if unk is None:
        return found
    for piece in dict.fromkeys(_PIECES.findall(text)):
        ids = tokenizer.encode(piece)
        if unk not in ids:
            continue
        chars = len(ids) == len(piece)  # one token per character: name the characters
        for p in [c for c, i in zip(piece, ids, strict=True) if i == unk] if chars else [piece]:
            if p not in found:
                found.append(p)
            if len(found) == limit:
                return found
    return found
