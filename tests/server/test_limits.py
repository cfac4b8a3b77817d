"""Bad requests get a 4xx with a JSON error that says what is wrong; a saturated server says it is busy."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.server.conftest import error_of


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
        ({"prompt": "x", "seed": 1180591620717411303424}, "seed"),  # beyond 64 bits
        ({"prompt": "x", "n": 0}, "n"),
        ({"prompt": "x", "logprobs": -1}, "logprobs"),
        ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"prompt": "x", "stop": ""}, "stop"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["x", ""]}, "prompt"),
    ],
)
def test_invalid_completion_bodies_are_422_naming_the_field(gpt, body, field) -> None:
    response = gpt.client.post("/v1/completions", json=body)
    assert field in error_of(response, 422) and response.json()["error"]["param"] == field


def test_a_seed_beyond_64_bits_is_422_not_a_server_error(gpt) -> None:
    message = error_of(gpt.client.post("/v1/completions", json={"prompt": "x", "seed": 2**64}), 422)
    assert "18446744073709551615" in message  # the largest seed accepted
    assert complete_ok(gpt, seed=2**64 - 1)["usage"]["completion_tokens"] >= 1


def complete_ok(served, **body) -> dict:
    response = served.client.post("/v1/completions", json={"prompt": "To be", "max_tokens": 3, **body})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"logprobs": 6}, "logprobs", "--max-logprobs"),
        ({"n": 9}, "n", "--max-n"),
        ({"model": "gpt-3.5-turbo-instruct"}, "model", "/v1/models"),
        ({"suffix": "the end"}, "suffix", "fill in the middle"),
        ({"best_of": 3}, "best_of", "n completions"),
        ({"logit_bias": {"5": 10}}, "logit_bias", "not supported"),
        ({"prompt": [3, 10_000]}, "prompt", "10000"),
    ],
)
def test_what_the_server_cannot_do_is_a_4xx_in_openais_shape(gpt, body, param, words) -> None:
    response = gpt.client.post("/v1/completions", json={"prompt": "To be", **body})
    message = error_of(response, (400, 404))
    error = response.json()["error"]
    assert words in message and error["param"] == param and error["type"] == "invalid_request_error"
    if param == "model":
        assert response.status_code == 404 and error["code"] == "model_not_found"
        assert gpt.bundle.path.name in message  # says which model it does serve
    assert complete_ok(gpt, model=gpt.bundle.path.name, logprobs=5, n=8, suffix="", best_of=8)


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
    message = error_of(gpt.client.post("/v1/completions", json={"prompt": ["To be", "a" * 201]}), 413)
    assert "prompt 1 has 201 tokens" in message


def test_an_endpoint_the_family_lacks_is_404_with_the_familys_one_line(gpt, translator, encoder) -> None:
    message = error_of(gpt.client.post("/v1/translations", json={"text": "one two"}), 404)
    assert message == (
        "/v1/translations needs a translator, and this is a GPT language model (decoder only): "
        "use `qkv generate` with it"
    )
    assert gpt.client.get("/v1/model").json()["unavailable"] == {"/v1/translations": message}
    message = error_of(translator.client.post("/v1/completions", json={"prompt": "one"}), 404)
    assert message == (
        "/v1/completions needs a language model, and this is an encoder-decoder translator: use `qkv translate` with it"
    )
    message = error_of(encoder.client.post("/v1/next-token", json={"prompt": "one"}), 404)
    assert message.startswith("next-token prediction needs an unembedding, and an encoder (BERT family) has none: ")
    assert encoder.client.get("/v1/model").json()["unavailable"]["/v1/next-token"] == message
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
            assert "busy" in message and "--max-batch" in message  # the batched scheduler: one row
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


def test_a_client_that_leaves_a_plain_request_stops_its_generation_and_frees_its_slot(busy_gpt) -> None:
    """Not streamed: the server notices the disconnect while the model works, not when 100,000 tokens are done."""
    import threading

    body = {"prompt": "To be", "max_tokens": 100_000, "temperature": 1.0, "ignore_eos": True}
    outcome: list[BaseException] = []

    def leave_early() -> None:
        with httpx.Client(base_url=busy_gpt.url, timeout=httpx.Timeout(30, read=1.5)) as client:
            try:
                client.post("/v1/completions", json=body)
            except httpx.ReadTimeout as error:  # the client gives up and closes its connection
                outcome.append(error)

    thread = threading.Thread(target=leave_early)
    thread.start()
    deadline = time.monotonic() + 10
    while busy_gpt.client.get("/health").json()["active_generations"] == 0:
        assert time.monotonic() < deadline, "the generation never started"
        time.sleep(0.02)
    thread.join(30)
    assert outcome, "the client was answered before it left: the generation was not long enough to test"
    wait_for_idle(busy_gpt, timeout=10)  # 100,000 tokens would take minutes: it was cancelled
    data = busy_gpt.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "temperature": 0}).json()
    assert data["usage"]["completion_tokens"] == 2
