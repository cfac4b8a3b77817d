"""What one token spells on its own: the text a table, a logprob entry or the playground shows for one id."""

from __future__ import annotations

from qkv.errors import QkvError
from qkv.tokenizers.base import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """What one token spells on its own: its decoded text (special tokens as their names, e.g. "<bos>"), or
    its vocabulary entry when that is not text by itself (part of a UTF-8 character split across tokens, a
    token that decodes to nothing)."""
    try:
        text = tokenizer.decode([token_id], skip_special=False)
    except QkvError:
        return tokenizer.id_to_token(token_id)
    return text if text and "\ufffd" not in text else tokenizer.id_to_token(token_id)
