"""/v1/chat/completions through the official `openai` client: the answer qkv.chat gives at temperature 0, streamed
or not, on both schedulers; n, seed, stop, max_completion_tokens, logprobs and usage in OpenAI's shape; and the
refusals as the client's own exceptions with our message."""

from __future__ import annotations

import pytest

import qkv
from qkv.server import Limits
from tests.server.conftest import serve

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install -e '.[test]'")

QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module", params=["batched", "sequential"])
def chat_server(request, smol_hf_dir):
    limits = Limits(max_prompt_tokens=200, max_tokens=64, max_concurrent=4, queue_timeout=30)
    for served in serve(str(smol_hf_dir), limits, scheduler=request.param):
        with openai.OpenAI(base_url=served.url + "/v1", api_key="-", max_retries=0, timeout=60) as client:
            yield served, client, client.models.list().data[0].id


def test_the_answer_is_qkv_chats_streamed_or_not(chat_server) -> None:
    served, client, model = chat_server
    expected = qkv.chat(served.bundle, QUESTION, max_new_tokens=20, temperature=0)
    answer = client.chat.completions.create(model=model, messages=QUESTION, max_completion_tokens=20, temperature=0)
    (choice,) = answer.choices
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert answer.usage.completion_tokens == len(expected.token_ids)
    assert answer.usage.prompt_tokens == expected.prompt_tokens
    stream = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=20, temperature=0,
                                            stream=True, stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)


def test_n_seed_stop_and_logprobs(chat_server) -> None:
    _, client, model = chat_server
    options = dict(model=model, messages=QUESTION, max_completion_tokens=16, temperature=1.3, seed=3, n=2)
    first = client.chat.completions.create(**options, logprobs=True, top_logprobs=2)
    again = client.chat.completions.create(**options, logprobs=True, top_logprobs=2)
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert [c.index for c in first.choices] == [0, 1]
    for choice in first.choices:
        content = choice.logprobs.content
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in content)
        assert all(t.bytes == list(t.token.encode()) for t in content)
    text = first.choices[0].message.content
    if len(text) > 4:
        cut = client.chat.completions.create(**options, stop=[text[2:4]])
        assert cut.choices[0].message.content == text[: text.index(text[2:4])]
        assert cut.choices[0].finish_reason == "stop"


def test_refusals_are_the_clients_exceptions_with_our_message(chat_server) -> None:
    _, client, model = chat_server
    with pytest.raises(openai.BadRequestError, match="more than this server allows"):
        client.chat.completions.create(model=model, messages=QUESTION, max_completion_tokens=10_000)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        client.chat.completions.create(model=model, messages=QUESTION, response_format={"type": "json_object"})
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])  # fmt: skip
    with pytest.raises(openai.UnprocessableEntityError, match="messages"):
        client.chat.completions.create(model=model, messages=[])


def test_a_model_without_a_template_is_refused_in_one_line(gpt) -> None:
    response = gpt.client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}]})
    assert response.status_code == 400 and "chat template" in response.json()["error"]["message"]
