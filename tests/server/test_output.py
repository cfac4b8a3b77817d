"""The server's side of a completion's text (qkv.server.output): the echoed prompt's logprobs are those `qkv eval`
sums (token_log_probs), with the first token null, and OpenAI's logprobs shape."""

from __future__ import annotations

import torch

from qkv.decoding.text import Entry
from qkv.server.output import logprobs_dict, prompt_entries
from qkv.tokenizers import CharTokenizer
from qkv.training.perplexity import token_log_probs
from tests.conftest import tiny_gpt


def test_prompt_entries_are_the_prompts_log_probabilities_with_their_offsets() -> None:
    tokenizer = CharTokenizer.train("abcdefgh ")
    model = tiny_gpt(vocab_size=tokenizer.vocab_size, dtype=torch.float32)
    ids = tokenizer.encode("abc de")
    entries = prompt_entries(model, tokenizer, ids, top=2)
    scored = token_log_probs(model, ids, top=2)
    assert entries[0].logprob is None and entries[0].top is None and entries[0].offset == 0
    assert [e.logprob for e in entries[1:]] == [float(x) for x in scored.logprobs]
    assert [e.offset for e in entries] == list(range(len("abc de")))  # one character per token
    assert [e.token for e in entries] == list("abc de")
    assert all(2 <= len(e.top) <= 3 for e in entries[1:])  # the top 2, and the chosen one when not among them


def test_logprobs_dict_is_openais_shape() -> None:
    entries = [Entry("a", None, None, 0), Entry("b", -0.5, {"b": -0.5, "c": -1.0}, 1)]
    expected = {"tokens": ["a", "b"], "token_logprobs": [None, -0.5], "top_logprobs": [None, {"b": -0.5, "c": -1.0}]}
    assert logprobs_dict(entries) == {**expected, "text_offset": [0, 1]}
