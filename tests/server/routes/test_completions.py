"""/v1/completions against a real server: the OpenAI response shape, server-sent events, seeds, and many
clients at once without one request's settings reaching another's."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
import torch

from qkv.decoding import generate


def complete(served, **body) -> dict:
    response = served.client.post("/v1/completions", json={"prompt": "To be, or", **body})
    assert response.status_code == 200, response.text
    return response.json()


def stream_events(served, **body) -> tuple[list[str], httpx.Headers]:
    lines = []
    with served.client.stream("POST", "/v1/completions", json={"prompt": "To be, or", "stream": True, **body}) as r:
        assert r.status_code == 200
        headers = r.headers
        for line in r.iter_lines():
            lines.append(line)
    return lines, headers


def greedy_reference(served, prompt: str, n: int) -> str:
    """What qkv.decoding.generate makes at temperature 0, in this process, with the same weights."""
    tokenizer, model = served.bundle.tokenizer, served.bundle.model
    ids = tokenizer.encode(prompt)
    out = generate(model, ids, max_new_tokens=n, temperature=0, eos_id=tokenizer.eos_id)[0, len(ids) :].tolist()
    if tokenizer.eos_id in out:
        out = out[: out.index(tokenizer.eos_id)]
    return tokenizer.decode(out)


def test_a_completion_has_the_openai_shape_with_usage(gpt) -> None:
    data = complete(gpt, max_tokens=12, temperature=0.8, seed=1)
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert isinstance(data["created"], int) and data["model"] == gpt.bundle.path.name
    (choice,) = data["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] in ("stop", "length") and choice["logprobs"] is None
    assert isinstance(choice["text"], str) and choice["text"]
    prompt_tokens = len(gpt.bundle.tokenizer.encode("To be, or"))
    usage = data["usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert 1 <= usage["completion_tokens"] <= 12 and usage["total_tokens"] == prompt_tokens + usage["completion_tokens"]
    if choice["finish_reason"] == "length":
        assert usage["completion_tokens"] == 12


def test_greedy_text_is_what_generate_makes(gpt) -> None:
    data = complete(gpt, max_tokens=40, temperature=0)
    assert data["choices"][0]["text"] == greedy_reference(gpt, "To be, or", 40)


def test_same_seed_same_text_and_other_seeds_vary(gpt) -> None:
    first = complete(gpt, max_tokens=30, temperature=1.2, seed=7)["choices"][0]["text"]
    again = complete(gpt, max_tokens=30, temperature=1.2, seed=7)["choices"][0]["text"]
    assert first == again
    others = {complete(gpt, max_tokens=30, temperature=1.2, seed=s)["choices"][0]["text"] for s in range(8, 14)}
    assert len(others | {first}) > 1  # sampling at T = 1.2 does not always write the same 30 characters


def test_stream_sends_openai_chunks_then_done(gpt) -> None:
    lines, headers = stream_events(gpt, max_tokens=10, temperature=0.9, seed=3)
    assert headers["content-type"].startswith("text/event-stream")
    events = [line for line in lines if line]  # events are separated by blank lines
    assert all(line.startswith("data: ") for line in events)
    assert lines[-1] == "" and events[-1] == "data: [DONE]"
    chunks = [json.loads(line[len("data: ") :]) for line in events[:-1]]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("cmpl-")
    for chunk in chunks[:-1]:
        assert set(chunk) == {"id", "object", "created", "model", "choices"}
        assert chunk["object"] == "text_completion"
        assert chunk["choices"] == [
            {"text": chunk["choices"][0]["text"], "index": 0, "logprobs": None, "finish_reason": None}
        ]
        assert chunk["choices"][0]["text"]
    last = chunks[-1]
    assert last["choices"][0]["text"] == "" and last["choices"][0]["finish_reason"] in ("stop", "length")
    assert last["usage"]["completion_tokens"] >= len(chunks) - 1
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == complete(gpt, max_tokens=10, temperature=0.9, seed=3)["choices"][0]["text"]


def test_each_streamed_character_arrives_as_its_own_chunk(gpt) -> None:
    lines, _ = stream_events(gpt, max_tokens=8, temperature=0)
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    texts = [c["choices"][0]["text"] for c in chunks[:-1]]
    assert len(texts) == chunks[-1]["usage"]["completion_tokens"]  # a char tokenizer: one piece per token
    assert "".join(texts) == greedy_reference(gpt, "To be, or", 8)


def test_concurrent_clients_do_not_leak_settings(gpt) -> None:
    """8 threads at once: greedy requests give the greedy text, seeded ones the text they give alone."""
    settings = [dict(temperature=0) if i % 2 == 0 else dict(temperature=0.5 + 0.25 * i, seed=100 + i) for i in range(8)]
    alone = {i: complete(gpt, max_tokens=25, **s)["choices"][0]["text"] for i, s in enumerate(settings) if "seed" in s}
    greedy = greedy_reference(gpt, "To be, or", 25)
    results: dict[int, list[str]] = {i: [] for i in range(8)}
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def client(i: int) -> None:
        try:
            start.wait()
            for round_ in range(3):
                stream = (i + round_) % 2 == 0
                if stream:
                    lines, _ = stream_events(gpt, max_tokens=25, **settings[i])
                    text = "".join(json.loads(x[6:])["choices"][0]["text"] for x in lines if x.startswith("data: {"))
                else:
                    text = complete(gpt, max_tokens=25, **settings[i])["choices"][0]["text"]
                results[i].append(text)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for i, texts in results.items():
        assert len(texts) == 3
        expected = greedy if "seed" not in settings[i] else alone[i]
        assert texts == [expected] * 3, (i, settings[i], texts, expected)


def test_a_prompt_longer_than_the_context_is_cropped_like_generate_crops_it(gpt) -> None:
    prompt = "Whether 'tis nobler in the mind to suffer the slings and arrows"  # 63 characters > context 32
    data = gpt.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10, "temperature": 0}).json()
    assert data["choices"][0]["text"] == greedy_reference(gpt, prompt, 10)
    assert data["usage"]["prompt_tokens"] == len(prompt)


def test_the_model_is_left_as_it_was(gpt) -> None:
    complete(gpt, max_tokens=5, temperature=0)
    model = gpt.server.app.state.service.model
    assert not model.training
    assert torch.is_grad_enabled()  # the server's work does not switch gradients off in the caller's thread


def test_ignore_eos_makes_exactly_max_tokens(gpt) -> None:
    for seed in range(5):
        data = complete(gpt, max_tokens=40, temperature=1.5, seed=seed, ignore_eos=True)
        assert data["usage"]["completion_tokens"] == 40 and data["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("scheduler", ["batched", "sequential"])
def test_qkv_serve_prompt_lookup_answers_greedy_requests_as_before_from_drafts(gpt, gpt_run, checked_drafts,
                                                                               scheduler) -> None:  # fmt: skip
    """`qkv serve --prompt-lookup 4`: a greedy completion is the plain server's, text, tokens and logprobs, streamed
    or not, and the engine checked drafts to make it."""
    from qkv.server import Limits
    from tests.server.conftest import serve

    prompt = "To be, or not to be"  # drafts end at the context (32 characters): room for 12 new ones
    body = dict(prompt=prompt, max_tokens=12, temperature=0, logprobs=1)
    plain = complete(gpt, **body)["choices"][0]
    assert not checked_drafts
    for served in serve(gpt_run, Limits(max_tokens=100, prompt_lookup=4), scheduler=scheduler):
        drafted = complete(served, **body)["choices"][0]
        lines, _ = stream_events(served, **body)
    assert checked_drafts  # drafts were checked in the engine's steps
    assert drafted["text"] == plain["text"] == greedy_reference(gpt, prompt, 12)
    assert drafted["logprobs"]["tokens"] == plain["logprobs"]["tokens"]
    assert drafted["logprobs"]["token_logprobs"] == pytest.approx(plain["logprobs"]["token_logprobs"], abs=1e-4)
    chunks = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: {")]
    assert "".join(c["choices"][0]["text"] for c in chunks) == plain["text"]
