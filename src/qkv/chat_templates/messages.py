"""Checking a conversation before a template sees it: OpenAI's message format, text only.

A conversation is a non-empty list of messages ``{"role": str, "content": ...}``, where the content is a
string or OpenAI's list of parts ``[{"type": "text", "text": "..."}, ...]``; the parts' texts are joined with
newlines (as vLLM does for templates that expect a string), since qkv's models read text only. Other keys
(``name``, ``tool_calls``, ``reasoning_content``, ...) go to the template as they are, except those whose value
is None, which are dropped (as transformers does: many templates test whether a key is there, not its value).
Each problem is one :class:`~qkv.errors.QkvError` naming the message, e.g. ``messages[2].content[0]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from qkv.chat_templates.template import plain_data
from qkv.errors import QkvError

EXAMPLE = '[{"role": "user", "content": "Hello"}]'
ROLES = ("system", "user", "assistant", "tool", "developer", "function", "ipython")
"""The roles a message may have: OpenAI's (developer is its newer name for system), and Llama 3.1's ipython."""
REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")  # the names a message's reasoning comes under


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """A checked copy of ``messages`` as plain data, each content a string; a QkvError for the first problem."""
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise QkvError(f"messages must be a list of {{'role': ..., 'content': ...}} objects, got "
                       f"{type(messages).__name__}: write e.g. {EXAMPLE}")  # fmt: skip
    if not messages:
        raise QkvError(f"the conversation is empty: give at least one message, e.g. {EXAMPLE}")
    return [_check_message(i, message) for i, message in enumerate(messages)]


def _check_message(i: int, message: Any) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(message, Mapping):
        raise QkvError(
            f"{where} is a {type(message).__name__}, not an object: write {{'role': 'user', 'content': ...}}"
        )
    role = message.get("role")
    if role is None:
        raise QkvError(f"{where} has no 'role': give each message a role such as 'system', 'user' or 'assistant'")
    if not isinstance(role, str) or role not in ROLES:
        raise QkvError(f"{where}.role is {role!r}: the roles are {', '.join(ROLES)}")
    if message.get("content") is None:
        raise QkvError(f"{where} ({role}) has no 'content': give the message's text as 'content'")
    checked = {key: plain_data(value) for key, value in message.items() if value is not None}
    checked["content"] = _content_text(where, message["content"])
    return _with_reasoning_aliases(checked)


def _content_text(where: str, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        raise QkvError(
            f"{where}.content is a {type(content).__name__}: give a string, or a list of "
            "{'type': 'text', 'text': ...} parts"
        )
    texts = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, Mapping):
            raise QkvError(f"{at} is a {type(part).__name__}: write each part as {{'type': 'text', 'text': ...}}")
        if part.get("type") != "text":
            kind = f"has type {part['type']!r}" if "type" in part else "has no 'type'"
            raise QkvError(f"{at} {kind}: this model reads text only; send {{'type': 'text', 'text': ...}} parts")
        if not isinstance(part.get("text"), str):
            raise QkvError(f"{at} has no string 'text': write the part as {{'type': 'text', 'text': '...'}}")
        texts.append(part["text"])
    return "\n".join(texts)


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    """A message's reasoning under ``thinking`` and ``reasoning_content`` too, whichever name it came under (as
    transformers passes it: templates read one or the other)."""
    reasoning = next((message[key] for key in REASONING_KEYS if key in message), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}
