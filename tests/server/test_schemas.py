"""The request bodies (qkv.server.schemas): what pydantic refuses before any work, and what it ignores."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qkv.server.schemas import ChatCompletionRequest, CompletionRequest, TranslationRequest


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (dict(prompt=""), "the prompt is empty"),
        (dict(prompt=["a", ""]), "a prompt in the list is empty"),
        (dict(prompt=["a"] * 65), "at most 64 prompts"),
        (dict(prompt="a", stop=["1", "2", "3", "4", "5"]), "at most 4 stop strings"),
        (dict(prompt="a", stop=""), "a stop string is empty"),
        (dict(prompt="a", temperature=-1), "temperature"),
        (dict(prompt="a", min_p=1.5), "min_p"),
        (dict(prompt="a", repetition_penalty=0), "repetition_penalty"),
        (dict(prompt="a", presence_penalty=2.5), "presence_penalty"),
    ],
)
def test_bad_completion_bodies(body: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        CompletionRequest(**body)


def test_unknown_fields_are_ignored_and_chat_bodies_are_checked() -> None:
    assert CompletionRequest(prompt="a", user="me", stream_options={"x": 1}).prompt == "a"
    with pytest.raises(ValidationError, match="messages"):
        ChatCompletionRequest(messages=[])
    with pytest.raises(ValidationError, match="top_logprobs"):
        ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=21)
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert chat.messages[0].content == [{"type": "text", "text": "hi"}]
    with pytest.raises(ValidationError, match="a sentence to translate is empty"):
        TranslationRequest(text=["one", " "])
