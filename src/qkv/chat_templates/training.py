"""A conversation as a fine-tuning example: its token ids, and a mask that is True on the assistant's tokens.

Fine-tuning a chat model on conversations usually takes the loss only where the model should learn to write:
the assistant turns, their content and the token that ends them (so that the model learns to stop), never
the system or user text nor the role headers the template writes (TRL's assistant-only loss)::

    <|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\nHello!<|im_end|>\\n
    .......................................................^^^^^^^^^^^^^^^^....

Where each assistant turn lies is found from the template, whatever its style:

- a template with ``{% generation %}`` blocks says it: each block's characters are the assistant's (as
  transformers' ``return_assistant_tokens_mask`` and TRL read them);
- otherwise the conversation is rendered cut before each assistant message with a generation prompt, and cut
  after it: the assistant's characters run from the end of the first (the header written) to the end of the
  second, without the whitespace the template writes after the turn ("\\n" after ``<|im_end|>``).

The whole conversation is encoded once (``special=True``, the ids of :func:`qkv.chat_templates.chat_prompt`), and a
token is the assistant's when its characters overlap an assistant's (the tokenizer's offsets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from qkv.chat_templates.messages import check_messages
from qkv.chat_templates.prompt import template_variables
from qkv.chat_templates.source import template_of
from qkv.chat_templates.template import ChatTemplate, render, render_with_generation_spans
from qkv.errors import QkvError

if TYPE_CHECKING:
    from qkv.model_dir import ModelBundle

Span = tuple[int, int]  # (start, end) characters of the rendered text


def chat_training_example(
    bundle: ModelBundle, messages: list[dict[str, Any]], template: ChatTemplate | str | None = None
) -> tuple[list[int], list[bool]]:
    """(ids, mask) of a conversation with at least one assistant message: the ids of the whole conversation
    rendered without a generation prompt, and True exactly on the tokens of the assistant turns."""
    chat = template_of(bundle, template)
    checked = check_messages(messages)
    if not any(m["role"] == "assistant" for m in checked):
        raise QkvError(
            "the conversation has no assistant message, so there is nothing to learn from it: training examples "
            "need at least one {'role': 'assistant', 'content': ...}"
        )
    variables = template_variables(bundle.tokenizer)
    text, spans = render_with_generation_spans(chat, checked, variables=variables)
    if not spans:
        spans = assistant_spans(chat, checked, text, variables)
    ids, offsets = bundle.tokenizer.encode_with_offsets(text, special=True)
    return ids, tokens_in_spans(offsets, spans)


def assistant_spans(
    template: ChatTemplate, messages: list[dict[str, Any]], text: str, variables: dict[str, Any]
) -> list[Span]:
    """The characters of each assistant turn in ``text`` (the whole conversation rendered), found by rendering
    the conversation cut before and after each assistant message (see the module docstring)."""
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        header = render(template, messages[:i], add_generation_prompt=True, variables=variables)
        turn = render(template, messages[: i + 1], add_generation_prompt=False, variables=variables)
        if not text.startswith(turn):
            raise QkvError(
                f"{template.source} writes messages[{i}] differently once later messages follow (it may drop "
                "earlier reasoning), so the assistant turns cannot be found in the whole conversation: cut the "
                "conversation after each assistant turn, or use a template with {% generation %} blocks"
            )
        start = _common_prefix(header, turn)
        spans.append((start, start + len(turn[start:].rstrip())))
    return spans


def tokens_in_spans(offsets: list[Span], spans: list[Span]) -> list[bool]:
    """True for each token whose characters overlap one of ``spans`` (both in order): one pass over the tokens."""
    spans = sorted(s for s in spans if s[1] > s[0])
    mask, k = [], 0
    for start, end in offsets:
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        mask.append(k < len(spans) and end > spans[k][0])
    return mask


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])
