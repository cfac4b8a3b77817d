"""The battery's HTTP cases (bench/bad_inputs.py): request bodies sent to real `qkv serve` processes (a GPT, a
translator, a chat model from a GGUF file), and clients that leave before their answer."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVED = {"gpt": ["{gpt}"], "translator": ["{translator}"], "chat": ["{llama_gguf}"]}


@dataclass
class HttpCase:
    server: str
    name: str
    path: str
    body: Any  # a dict (sent as JSON), bytes (sent as they are), or None (GET)
    words: tuple[str, ...]
    expect: str = "refuse"
    leave_after: float | None = None  # a client that leaves: seconds before it closes the connection
    surface: str = "http"
    timeout: float = 60.0
    forbid: tuple[str, ...] = ()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Servers:
    """One `qkv serve` process per fixture, started on first use, stopped at the end."""

    def __init__(self, paths: dict, scratch: Path) -> None:
        self.paths, self.scratch = paths, scratch
        self.running: dict[str, tuple[subprocess.Popen, int, Any]] = {}

    def __enter__(self) -> Servers:
        return self

    def __exit__(self, *exc) -> None:
        for process, _, log in self.running.values():
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
            log.close()

    def port(self, name: str) -> int:
        if name not in self.running:
            port = _free_port()
            log = open(self.scratch / f"serve-{name}.log", "w+")  # noqa: SIM115
            model = [a.format(**self.paths) for a in SERVED[name]]
            command = [sys.executable, "-m", "qkv", "serve", *model, "--port", str(port), "--log-level", "warning",
                       "--max-tokens", "200", "--queue-timeout", "30s"]  # fmt: skip
            process = subprocess.Popen(command, stdout=log, stderr=log, env=os.environ.copy())
            self.running[name] = (process, port, log)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if _request(port, "GET", "/health", None, 2)[0] == 200:
                        break
                except OSError:
                    time.sleep(0.3)
        return self.running[name][1]

    def log(self, name: str) -> str:
        log = self.running[name][2]
        log.flush()
        return Path(log.name).read_text(errors="replace")

    def run(self, case: HttpCase) -> tuple[str, str]:
        port = self.port(case.server)
        before = len(self.log(case.server))
        try:
            if case.leave_after is not None:
                return self._leave(case, port)
            status, text = _request(
                port, "POST" if case.body is not None else "GET", case.path, case.body, case.timeout
            )
        except TimeoutError:
            return "hang", f"no answer within {case.timeout:.0f} s"
        except OSError as error:
            return "traceback", f"the server is gone ({error})"
        crashed = "Traceback (most recent call last)" in self.log(case.server)[before:]
        return classify(case, status, text, crashed)

    def _leave(self, case: HttpCase, port: int) -> tuple[str, str]:
        """Send the request, leave after ``case.leave_after`` seconds, then read /metrics until the request is
        counted: "cancelled" is clean, "ok" (it ran on for nobody) is a leak."""
        counter = "qkv_translation_requests_total" if "translations" in case.path else "qkv_requests_total"
        before = _counts(port, counter)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=case.timeout)
        connection.request("POST", case.path, json.dumps(case.body), {"Content-Type": "application/json"})
        time.sleep(case.leave_after or 0)
        connection.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        deadline = time.monotonic() + case.timeout
        while time.monotonic() < deadline:
            after = _counts(port, counter)
            grown = {status: after.get(status, 0) - before.get(status, 0) for status in after}
            if any(grown.values()):
                status = max(grown, key=grown.get)
                return ("clean" if status == "cancelled" else "leak"), f"counted as {status!r} in /metrics"
            time.sleep(0.2)
        return "leak", "still running (not counted) long after its client left"


def _counts(port: int, counter: str) -> dict[str, int]:
    _, text = _request(port, "GET", "/metrics", None, 10)
    counts = {}
    for line in text.splitlines():
        if line.startswith(counter + "{"):
            status = line.split('status="')[1].split('"')[0]
            counts[status] = int(float(line.split()[-1]))
    return counts


def _request(port: int, method: str, path: str, body: Any, timeout: float) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        connection.request(method, path, data, {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()


def _message(text: str) -> str | None:
    """The error message of a JSON error body or of an error event in a stream; None when there is none."""
    for chunk in [text, *(line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: {"))]:
        try:
            data = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message"))
        if isinstance(data, dict) and "detail" in data:
            return json.dumps(data["detail"])[:300]
    return None


def classify(case: HttpCase, status: int, text: str, crashed: bool) -> tuple[str, str]:
    message = _message(text)
    named = message is not None and any(w.lower() in message.lower() for w in case.words)
    if status >= 500 or crashed:
        return "traceback", f"{status} {(message or text)[:160]}"
    if case.expect == "ok":
        if status == 200 and message is None:
            if any(word in text for word in case.forbid):
                return "unclear", f"200 holding {case.forbid}"
            return "clean", "200"
        return "silent", f"refused a good request: {status} {(message or text)[:150]}"
    if status == 200 and message is None:
        return "silent", f"200 {text[:150]!r}"
    if message is None or "\n" in message or not named:
        return "unclear", f"{status} {(message or text)[:180]}"
    return "clean", f"{status} {message[:180]}"


def c(server: str, name: str, body: Any, words: tuple[str, ...] | str, **kw) -> HttpCase:
    return HttpCase(server, name, "/v1/completions", body, (words,) if isinstance(words, str) else words, **kw)


def ch(name: str, body: Any, words: tuple[str, ...] | str, server: str = "chat", **kw) -> HttpCase:
    body = body if isinstance(body, bytes) else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                                  **body}  # fmt: skip
    body = {k: v for k, v in body.items() if v is not None} if isinstance(body, dict) else body
    return HttpCase(server, name, "/v1/chat/completions", body, (words,) if isinstance(words, str) else words, **kw)


def tr(name: str, body: Any, words: tuple[str, ...] | str, server: str = "translator", **kw) -> HttpCase:
    return HttpCase(server, name, "/v1/translations", body, (words,) if isinstance(words, str) else words, **kw)


P = {"prompt": "to be", "max_tokens": 3}
TINY = 1e-300
HTTP_CASES = [
    # the temperature that rounds to 0 in float32 (a valid request: greedy)
    c("gpt", "T=1e-300 completions", {**P, "temperature": TINY}, (), expect="ok"),
    c(
        "gpt",
        "T=1e-300 completions stream",
        {**P, "temperature": TINY, "stream": True},
        (),
        expect="ok",
        forbid=('"error"',),
    ),  # fmt: skip
    c("gpt", "T=1e-300 completions logprobs", {**P, "temperature": TINY, "logprobs": 2}, (), expect="ok"),
    ch("T=1e-300 chat", {"temperature": TINY}, (), expect="ok"),
    ch("T=1e-300 chat stream", {"temperature": TINY, "stream": True}, (), expect="ok", forbid=('"error"',)),
    ch("T=5e-324 chat logprobs", {"temperature": 5e-324, "logprobs": True, "top_logprobs": 2}, (), expect="ok"),
    # /v1/completions bodies
    c("gpt", "completions prompt ''", {**P, "prompt": ""}, ("empty", "prompt")),
    c("gpt", "completions prompt []", {**P, "prompt": []}, ("empty", "prompt")),
    c("gpt", "completions prompt [[]]", {**P, "prompt": [[]]}, ("empty", "prompt")),
    c("gpt", "completions prompt ids out of range", {**P, "prompt": [999999]}, ("vocabulary", "id")),
    c("gpt", "completions prompt ids negative", {**P, "prompt": [-1]}, ("vocabulary", "id")),
    c("gpt", "completions max_tokens -1", {**P, "max_tokens": -1}, "max_tokens"),
    c("gpt", "completions max_tokens 10**12", {**P, "max_tokens": 10**12}, "max_tokens"),
    c("gpt", "completions n 0", {**P, "n": 0}, "n"),
    c("gpt", "completions n 1000", {**P, "n": 1000}, "n"),
    c("gpt", "completions temperature -1", {**P, "temperature": -1}, "temperature"),
    c("gpt", "completions temperature 'hot'", {**P, "temperature": "hot"}, "temperature"),
    c("gpt", "completions top_p 2", {**P, "top_p": 2}, "top_p"),
    c("gpt", "completions top_k -1", {**P, "top_k": -1}, "top_k"),
    c("gpt", "completions seed -1", {**P, "seed": -1}, "seed"),
    c("gpt", "completions stop ''", {**P, "stop": ""}, "stop"),
    c("gpt", "completions 5 stops", {**P, "stop": list("abcde")}, "stop"),
    c("gpt", "completions logit_bias", {**P, "logit_bias": {"5": 10}}, "logit_bias"),
    c("gpt", "completions suffix", {**P, "suffix": "end"}, "suffix"),
    c("gpt", "completions best_of 3", {**P, "best_of": 3}, "best_of"),
    c("gpt", "completions logprobs 1000", {**P, "logprobs": 1000}, "logprobs"),
    c("gpt", "completions model 'other'", {**P, "model": "other"}, "model"),
    c("gpt", "completions no prompt", {"max_tokens": 3}, "prompt"),
    c("gpt", "completions body a list", [1, 2], ("object", "body")),
    c("gpt", "completions body not JSON", b"{oops", ("JSON",)),
    c("gpt", "completions body not UTF-8", b'{"prompt": "\xff"}', ("UTF-8", "JSON")),
    c("gpt", "completions prompt beyond --max-prompt-tokens", {**P, "prompt": "to be " * 1000}, ("prompt", "tokens")),
    c("gpt", "completions presence_penalty 5", {**P, "presence_penalty": 5}, "presence_penalty"),
    c("gpt", "completions repetition_penalty 0", {**P, "repetition_penalty": 0}, "repetition_penalty"),
    c("gpt", "completions min_p 2", {**P, "min_p": 2}, "min_p"),
    c("gpt", "completions stream 'yes'", {**P, "stream": "maybe"}, "stream"),
    c(
        "gpt",
        "completions echo with max_tokens 0",
        {**P, "echo": True, "max_tokens": 0, "logprobs": 1},
        (),
        expect="ok",
    ),  # fmt: skip
    c("translator", "completions on a translator", P, ("translator", "translations", "not")),
    c(
        "chat",
        "completions stream_options without stream",
        {**P, "stream_options": {"include_usage": True}},
        ("stream_options", "stream"),
        expect="refuse",
    ),  # fmt: skip
    # /v1/chat/completions bodies
    ch("chat messages missing", {"messages": None}, "messages"),
    ch("chat messages []", {"messages": []}, "messages"),
    ch("chat messages a string", {"messages": "hi"}, "messages"),
    ch("chat message without role", {"messages": [{"content": "hi"}]}, "role"),
    ch("chat role robot", {"messages": [{"role": "robot", "content": "hi"}]}, ("role", "robot")),
    ch("chat content null", {"messages": [{"role": "user", "content": None}]}, "content"),
    ch("chat content 5", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ch(
        "chat content parts (OpenAI's list of text parts)",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        (),
        expect="ok",
    ),  # fmt: skip
    ch(
        "chat content an image part",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
        ("image", "text"),
    ),  # fmt: skip
    ch("chat content ''", {"messages": [{"role": "user", "content": ""}]}, ("empty", "content"), expect="ok"),
    ch("chat only a system message", {"messages": [{"role": "system", "content": "be brief"}]}, (), expect="ok"),
    ch(
        "chat last message from the assistant",
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]},
        (),
        expect="ok",
    ),
    ch("chat n 0", {"n": 0}, "n"),
    ch("chat max_tokens -1", {"max_tokens": -1}, "max_tokens"),
    ch("chat max_completion_tokens 10**12", {"max_completion_tokens": 10**12}, ("max_completion_tokens", "max_tokens")),
    ch(
        "chat max_tokens and max_completion_tokens differ",
        {"max_tokens": 3, "max_completion_tokens": 5},
        ("max_tokens", "max_completion_tokens"),
    ),  # fmt: skip
    ch("chat temperature -1", {"temperature": -1}, "temperature"),
    ch("chat top_logprobs 100", {"logprobs": True, "top_logprobs": 100}, "top_logprobs"),
    ch("chat top_logprobs without logprobs", {"top_logprobs": 3}, ("logprobs", "top_logprobs")),
    ch("chat tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ch("chat tool_choice required", {"tool_choice": "required"}, "tool"),
    ch("chat response_format json", {"response_format": {"type": "json_object"}}, "response_format"),
    ch("chat logit_bias", {"logit_bias": {"1": 5}}, "logit_bias"),
    ch("chat model 'other'", {"model": "other"}, "model"),
    ch("chat stop ''", {"stop": ""}, "stop"),
    ch(
        "chat a conversation beyond the context",
        {"messages": [{"role": "user", "content": "hello " * 3000}]},
        ("context", "tokens", "prompt"),
    ),  # fmt: skip
    ch("chat body not JSON", b"{oops", "JSON"),
    ch("chat on a GPT without a template", {}, ("template",), server="gpt"),
    # /v1/translations
    tr("translations text ''", {"text": ""}, ("empty",)),
    tr("translations text []", {"text": []}, ("empty", "text")),
    tr("translations text ['', 'one']", {"text": ["", "one two"]}, ("empty",)),
    tr("translations beam 0", {"text": "one", "beam": 0}, "beam"),
    tr("translations beam 1000", {"text": "one", "beam": 1000}, "beam"),
    tr("translations text 5", {"text": 5}, "text"),
    tr("translations on a GPT", {"text": "one"}, ("translator", "not"), server="gpt"),
    # other routes
    HttpCase(
        "gpt", "next-token target on a GPT", "/v1/next-token", {"prompt": "to", "target": "x"}, ("target", "translator")
    ),  # fmt: skip
    HttpCase("gpt", "next-token n 0", "/v1/next-token", {"prompt": "to", "n": 0}, ("n",)),
    HttpCase(
        "gpt", "next-token temperature 1e-300", "/v1/next-token", {"prompt": "to", "temperature": TINY}, (), expect="ok"
    ),  # fmt: skip
    HttpCase("gpt", "attention text ''", "/v1/attention", {"text": ""}, ("text", "empty")),
    HttpCase(
        "gpt", "attention target on a GPT", "/v1/attention", {"text": "to be", "target": "x"}, ("target", "translator")
    ),  # fmt: skip
    HttpCase(
        "gpt", "tokenize target on a GPT", "/tokenize", {"prompt": "to", "target": True}, ("target", "translator")
    ),
    HttpCase("gpt", "detokenize ids out of range", "/detokenize", {"tokens": [999999]}, ("vocabulary", "id")),
    HttpCase("gpt", "tokenize ''", "/tokenize", {"prompt": ""}, (), expect="ok"),
    HttpCase("chat", "walkthrough on a Llama", "/v1/walkthrough", {"text": "hi"}, (), expect="ok"),
    # clients that leave
    tr(
        "translations: the client leaves",
        {"text": ["one two three four five six seven eight"] * 64, "beam": 16},
        (),
        leave_after=0.3,
    ),  # fmt: skip
    c(
        "gpt",
        "completions: the client leaves (not streamed)",
        {"prompt": "to", "max_tokens": 200, "ignore_eos": True, "n": 8},
        (),
        leave_after=0.3,
    ),  # fmt: skip
    c(
        "gpt",
        "completions: the client leaves (streamed)",
        {"prompt": "to", "max_tokens": 200, "ignore_eos": True, "stream": True, "n": 8},
        (),
        leave_after=0.3,
    ),  # fmt: skip
    ch("chat: the client leaves (not streamed)", {"max_tokens": 200, "ignore_eos": True, "n": 8}, (), leave_after=0.3),
    ch(
        "chat: the client leaves (streamed)",
        {"max_tokens": 200, "ignore_eos": True, "n": 8, "stream": True},
        (),
        leave_after=0.3,
    ),  # fmt: skip
]
