"""Bad requests get a 4xx with a JSON error that says what is wrong; a saturated server says it is busy."""

from __future__ import annotations

import time

import httpx
import pytest


def error_of(response: httpx.Response, status: int | tuple[int, ...]) -> str:
    statuses = status if isinstance(status, tuple) else (status,)
    assert response.status_code in statuses, response.text
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == response.status_code
    message = body["error"]["message"]
    assert isinstance(message, str) and len(message) > 10
    return message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": ""}, "prompt"),
        ({}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": "x", "temperature": -0.5}, "temperature"),
        ({"prompt": "x", "top_p": 0}, "top_p"),
        ({"prompt": "x", "top_p": 1.5}, "top_p"),
        ({"prompt": "x", "top_k": -1}, "top_k"),
        ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "many"}, "max_tokens"),
        ({"prompt": "x", "seed": -1}, "seed"),
    ],
)
def test_invalid_completion_bodies_are_422_naming_the_field(gpt, body, field) -> None:
    assert field in error_of(gpt.client.post("/v1/completions", json=body), 422)


def test_a_body_that_is_not_json_is_422(gpt) -> None:
    response = gpt.client.post("/v1/completions", content=b"{prompt", headers={"Content-Type": "application/json"})
    assert "not valid JSON" in error_of(response, 422)


def test_too_many_tokens_and_too_long_prompts_are_refused_with_the_flag_to_change(gpt) -> None:
    message = error_of(gpt.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 301}), 400)
    assert "300" in message and "--max-tokens" in message
    message = error_of(gpt.client.post("/v1/completions", json={"prompt": "a" * 201}), (400, 413))
    assert "201 tokens" in message and "--max-prompt-tokens" in message
    message = error_of(gpt.client.post("/v1/attention", json={"text": "a" * 40}), (400, 413))
    assert "40 tokens" in message and "context" in message


def test_an_endpoint_the_model_kind_lacks_is_404_listing_what_it_supports(gpt, translator, encoder) -> None:
    message = error_of(gpt.client.post("/v1/translations", json={"text": "one two"}), 404)
    assert "GPT" in message and "/v1/completions" in message
    message = error_of(translator.client.post("/v1/completions", json={"prompt": "one"}), 404)
    assert "translator" in message and "/v1/translations" in message
    message = error_of(encoder.client.post("/v1/next-token", json={"prompt": "one"}), 404)
    assert "encoder" in message and "/v1/attention" in message
    assert "/v1/completions" in error_of(gpt.client.get("/v1/nothing-here"), 404)
    error_of(gpt.client.get("/v1/completions"), 405)


def test_translation_bodies_are_checked(translator) -> None:
    assert "at least one" in error_of(translator.client.post("/v1/translations", json={"text": []}), 422)
    assert "empty" in error_of(translator.client.post("/v1/translations", json={"text": ["one", "  "]}), 422)
    assert "beam" in error_of(translator.client.post("/v1/translations", json={"text": "one", "beam": 0}), 422)


def test_next_token_and_attention_bodies_are_checked(gpt) -> None:
    assert "n" in error_of(gpt.client.post("/v1/next-token", json={"prompt": "x", "n": 0}), 422)
    assert "temperature" in error_of(gpt.client.post("/v1/next-token", json={"temperature": -1}), 422)
    assert "text" in error_of(gpt.client.post("/v1/attention", json={"text": ""}), 422)


def wait_for_idle(served, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while served.client.get("/health").json()["active_generations"]:
        assert time.monotonic() < deadline, "the generation slot was never freed"
        time.sleep(0.05)


def test_a_saturated_server_answers_503_then_recovers_when_the_stream_is_closed(busy_gpt) -> None:
    body = {"prompt": "To be", "max_tokens": 50_000, "temperature": 1.0, "stream": True, "ignore_eos": True}
    with httpx.Client(base_url=busy_gpt.url, timeout=30) as holder:
        with holder.stream("POST", "/v1/completions", json=body) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()  # keep the iterator: dropping it would close the connection
            first = next(lines)
            assert first.startswith("data: {")  # the one slot is taken by a running generation
            assert busy_gpt.client.get("/health").json()["active_generations"] == 1
            started = time.monotonic()
            response = busy_gpt.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            waited = time.monotonic() - started
            message = error_of(response, (429, 503))
            assert "busy" in message and "--max-concurrent" in message
            assert response.headers.get("retry-after") == "1"
            assert 0.25 <= waited < 5  # it waited for a slot (queue_timeout 0.3 s) before giving up
            # one-pass requests have their own slots and still work while the generation runs
            assert busy_gpt.client.post("/v1/next-token", json={"prompt": "To"}).status_code == 200
    wait_for_idle(busy_gpt)  # closing the stream stopped the generation and freed its slot
    data = busy_gpt.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0}).json()
    assert data["usage"]["completion_tokens"] == 2


def test_a_waiting_request_gets_the_slot_when_it_frees_up(busy_gpt) -> None:
    import threading

    results: list[int] = []

    def short() -> None:
        results.append(busy_gpt.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3}).status_code)

    threads = [threading.Thread(target=short) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [200, 200, 200]  # each waits for the one slot and gets it within 0.3 s
