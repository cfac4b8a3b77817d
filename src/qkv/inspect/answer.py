"""The token a question is about: ``--target`` and ``--foil`` as one vocabulary id each.

Direct logit attribution and activation patching ask how much something pushes the logit of one next
token, or the difference logit(target) - logit(foil) between two candidates (TransformerLens's "logit
difference", e.g. " Mary" vs " John" in Wang et al.'s indirect-object task). Each candidate must be a
single token of the vocabulary; a word that splits into several tokens is not one logit.
"""

from __future__ import annotations

from qkv.errors import QkvError
from qkv.inspect.tokens import token_labels
from qkv.tokenizers import Tokenizer


def one_token(tokenizer: Tokenizer, text: str, *, what: str = "--target") -> int:
    """The id of ``text`` when it is exactly one token (its encoding, or a vocabulary entry by name such
    as "</s>"); QkvError naming the pieces otherwise."""
    if not isinstance(text, str) or text == "":
        raise QkvError(f"{what} is empty: give one token of the vocabulary, e.g. {what} ' the'")
    ids = tokenizer.encode(text)
    if len(ids) == 1:
        return ids[0]
    named = tokenizer.token_to_id(text)
    if named is not None:
        return named
    pieces = ", ".join(repr(t) for t in token_labels(tokenizer, ids)) or "none"
    hint = ""
    if not text.startswith(" ") and len(tokenizer.encode(" " + text)) == 1:
        hint = f" ({' ' + text!r} with its leading space is one)"
    raise QkvError(
        f"{what} {text!r} is {len(ids)} tokens ({pieces}), not one: give text that is a single token of the "
        f"vocabulary{hint}"
    )
