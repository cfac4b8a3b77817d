"""A request whose client leaves stops and is counted as "cancelled" in /metrics, never as "ok": a translation that
waits for the model (server/routes/translations.py watches the disconnect) and a chat completion, streamed or not.
And the newer bodies' checks: a temperature that rounds to 0 in float32 is greedy on both endpoints, streamed or
not; settings that mean nothing without another (stream_options without stream, max_tokens beside a different
max_completion_tokens), a role no template knows and tools a template never reads are 400s."""

from __future__ import annotations

import threading
import time

import pytest

from qkv.server import Limits
from tests.server.conftest import httpx, serve

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
HI = [{"role": "user", "content": "To be"}]


@pytest.fixture(scope="module")
def chat_gpt(gpt_run):
    """The tiny GPT served with a plain chat template, room for long answers, one generation at a time."""
    limits = Limits(max_prompt_tokens=200, max_tokens=100_000, max_concurrent=1, queue_timeout=30)
    yield from serve(gpt_run, limits, chat_template=CHAT_TEMPLATE)


def counts(served, counter: str) -> dict[str, int]:
    found = {}
    for line in served.client.get("/metrics").text.splitlines():
        if line.startswith(counter + "{"):
            found[line.split('status="')[1].split('"')[0]] = int(float(line.split()[-1]))
    return found


def counted(served, counter: str, before: dict[str, int], timeout: float = 20.0) -> dict[str, int]:
    """The statuses counted since ``before``, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = counts(served, counter)
        grown = {s: n - before.get(s, 0) for s, n in now.items() if n - before.get(s, 0)}
        if grown:
            return grown
        time.sleep(0.05)
    raise AssertionError(f"nothing was counted in {counter} within {timeout} s")


def leave(url: str, path: str, body: dict, *, after: float = 1.0, stream: bool = False) -> None:
    """Send ``body`` and go away after ``after`` seconds without reading the answer."""
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=after)) as client:
        try:
            if stream:
                with client.stream("POST", path, json=body) as response:
                    next(response.iter_lines())
                    time.sleep(after)
            else:
                client.post(path, json=body)
        except httpx.ReadTimeout:
            return
    if not stream:
        raise AssertionError("the request was answered before its client left: nothing to test")


def test_an_abandoned_translation_is_cancelled_not_counted_ok(translator, monkeypatch) -> None:
    from qkv.decoding.translator import Translator

    release, started = threading.Event(), threading.Event()
    translate = Translator.translate_n_best

    def held(self, *args, **kwargs):  # the model is busy until the client has gone
        started.set()
        release.wait(20)
        return translate(self, *args, **kwargs)

    monkeypatch.setattr(Translator, "translate_n_best", held)
    before = counts(translator, "qkv_translation_requests_total")
    leaving = threading.Thread(target=leave, args=(translator.url, "/v1/translations", {"text": "one two"}))
    leaving.start()
    assert started.wait(20)
    leaving.join(30)
    release.set()
    assert counted(translator, "qkv_translation_requests_total", before) == {"cancelled": 1}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_abandoned_chat_completion_stops_and_is_cancelled(chat_gpt, stream) -> None:
    before = counts(chat_gpt, "qkv_requests_total")
    body = {"messages": HI, "max_tokens": 100_000, "ignore_eos": True, "temperature": 1.0, "stream": stream}
    leave(chat_gpt.url, "/v1/chat/completions", body, stream=stream)
    assert counted(chat_gpt, "qkv_requests_total", before) == {"cancelled": 1}  # 100,000 tokens: it was stopped
    again = chat_gpt.client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2, "temperature": 0})
    assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 2


def _text(response) -> str:
    if response.headers["content-type"].startswith("text/event-stream"):
        import json

        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in e for e in events), events
        return "".join(c.get("text") or c.get("delta", {}).get("content") or "" for e in events for c in e["choices"])
    choice = response.json()["choices"][0]
    return choice.get("text") or choice["message"]["content"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_temperature_that_rounds_to_zero_is_greedy(chat_gpt, path, stream) -> None:
    body = {"prompt": "To be"} if path == "/v1/completions" else {"messages": HI}
    texts = []
    for temperature in (0, 1e-300, 5e-324):
        response = chat_gpt.client.post(path, json={**body, "max_tokens": 8, "temperature": temperature,
                                                    "stream": stream})  # fmt: skip
        assert response.status_code == 200, response.text
        texts.append(_text(response))
    assert texts[0] and texts[1] == texts[0] == texts[2]


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/v1/completions", {"prompt": "To", "stream_options": {"include_usage": True}}, "stream_options is only for"),
        ("/v1/chat/completions", {"messages": HI, "stream_options": {"include_usage": True}}, "set stream to true"),
        ("/v1/chat/completions", {"messages": HI, "max_tokens": 3, "max_completion_tokens": 5}, "differ: give one"),
        ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "role is 'robot': the roles"),
        ("/v1/chat/completions", {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}]},
         "never reads tools, so the model would not see them"),
    ],
)  # fmt: skip
def test_settings_that_would_be_ignored_are_refused(chat_gpt, path, body, message) -> None:
    response = chat_gpt.client.post(path, json=body)
    assert response.status_code == 400 and message in response.json()["error"]["message"], response.text
