"""The server's side of a completion's text: the echoed prompt's logprobs and OpenAI's logprobs shape.

Making text of the engine's outputs (detokenizing, stop strings, logprob entries) is
:mod:`qkv.decoding.text`, shared with ``qkv chat`` and ``qkv.complete``. The prompt's log-probabilities (with
``echo``) come from :func:`qkv.training.perplexity.token_log_probs`, the function ``qkv eval`` sums, so the two
agree. The first prompt token has no logprob (null): nothing comes before it.
"""

from __future__ import annotations

from torch import nn

from qkv.decoding.text import Entry, text_offsets, top_dict
from qkv.models.family import LANGUAGE_MODEL, in_role
from qkv.models.gpt import GPT
from qkv.tokenizers.base import Tokenizer
from qkv.tokenizers.token_text import token_text
from qkv.training.perplexity import token_log_probs


def prompt_entries(model: nn.Module, tokenizer: Tokenizer, ids: list[int], top: int) -> list[Entry]:
    """The prompt's tokens with their logprobs (the first one null), as ``echo`` returns them (a forward pass:
    run it on the model thread)."""
    scored = token_log_probs(in_role(model, LANGUAGE_MODEL, GPT, "echo"), ids, top=top)
    offsets = text_offsets(tokenizer, ids)
    entries = [Entry(token_text(tokenizer, ids[0]), None, None, 0)]
    for t in range(1, len(ids)):
        lp = float(scored.logprobs[t - 1])
        alternatives = []
        if top:
            assert scored.top_ids is not None and scored.top_logprobs is not None  # asked for with top > 0
            alternatives = list(zip(scored.top_ids[t - 1].tolist(), scored.top_logprobs[t - 1].tolist(), strict=True))
        entries.append(Entry(token_text(tokenizer, ids[t]), lp, top_dict(tokenizer, alternatives, ids[t], lp),
                             offsets[t]))  # fmt: skip
    return entries


def logprobs_dict(entries: list[Entry]) -> dict:
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [e.top for e in entries],
        "text_offset": [e.offset for e in entries],
    }
