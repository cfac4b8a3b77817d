"""Tokens as people read them, and picking one token out of a sentence.

The GPT notes: "Break up the input into little chunks, then into vectors. These chunks are called tokens."
Every picture and table in :mod:`qkv.inspect` labels its rows and columns with those chunks. A character
model's tokens include spaces and newlines, which would be invisible on an axis, so whitespace-only
tokens are drawn with visible symbols (" " -> "␣", "\\n" -> "↵", "\\t" -> "⇥").
"""

from __future__ import annotations

from collections.abc import Sequence

from qkv.errors import QkvError
from qkv.tokenizers import Tokenizer
from qkv.tokenizers.token_text import token_text

_VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "⏎"}


def visible(token: str) -> str:
    """``token`` with whitespace made visible: a token of only spaces/newlines becomes "␣", "↵", ...

    Tokens that contain other characters keep their spaces (GPT-2's " quick" stays " quick") but lose
    their line breaks, so a label always fits on one line.
    """
    if token == "":
        return "∅"
    if token.isspace():
        return "".join(_VISIBLE.get(c, "·") for c in token)
    return token.replace("\n", "↵").replace("\r", "").replace("\t", "⇥")


def token_label(tokenizer: Tokenizer, token_id: int) -> str:
    """:func:`token_text` made visible: the label every table, picture and the playground show for a token."""
    return visible(token_text(tokenizer, token_id))


def token_labels(tokenizer: Tokenizer, token_ids: Sequence[int]) -> list[str]:
    """:func:`token_label` of every id."""
    return [token_label(tokenizer, i) for i in token_ids]


def find_position(tokens: Sequence[str], spec: str | int, *, what: str = "--query") -> int:
    """The position of the token named by ``spec``: an index (0-based, negative counts from the end) or the
    token's text (its first occurrence; surrounding spaces and case are ignored if nothing matches exactly).

    Raises QkvError naming the tokens that exist when ``spec`` matches none of them.
    """
    n = len(tokens)
    text = str(spec).strip() if isinstance(spec, str) else None
    if isinstance(spec, int) or (text is not None and text.lstrip("-").isdigit() and text not in tokens):
        index = int(spec)
        if -n <= index < n:
            return index % n
        raise QkvError(f"{what} {index} is out of range: the text has {n} tokens, so use 0..{n - 1}")
    assert text is not None
    exact = list(tokens)
    shown_as = [visible(t).strip() for t in tokens]
    loose = [t.strip().lower() for t in tokens]
    for candidates, key in ((exact, text), (shown_as, text), (loose, text.lower())):
        if key in candidates:
            return candidates.index(key)
    shown = ", ".join(repr(t) for t in tokens[:12]) + (", ..." if n > 12 else "")
    raise QkvError(f"{what} {spec!r} is not one of the tokens ({shown}): give one of them or its index 0..{n - 1}")
