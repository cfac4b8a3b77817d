"""`qkv serve` as a user types it: a real process on a free port, and flag errors as one line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from qkv.cli import main


def test_qkv_serve_starts_a_server_that_answers(gpt_run) -> None:
    command = [
        sys.executable,
        "-m",
        "qkv",
        "serve",
        gpt_run,
        "--port",
        "0",
        "--max-tokens",
        "50",
        "--log-level",
        "info",
        "--allow-host",
        "my.box",
        "--no-packed-weights",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url, seen, deadline = None, [], time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            match = re.search(r"running on (http://127\.0\.0\.1:\d+)", line)
            url = match.group(1) if match else None
        assert url, "".join(seen)
        assert any("GPT language model" in line for line in seen)
        with httpx.Client(base_url=url, timeout=30) as client:
            assert client.get("/health").json()["status"] == "ok"
            assert client.get("/v1/model").json()["limits"]["max_tokens"] == 50
            body = {"prompt": "To be", "max_tokens": 5, "temperature": 0}
            assert client.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] >= 1
            assert client.get("/").status_code == 200
            assert client.get("/health", headers={"Host": "my.box:80"}).status_code == 200  # --allow-host
            assert client.get("/health", headers={"Host": "other.box"}).status_code == 400
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C: uvicorn shuts down gracefully
        _, rest = process.communicate(timeout=30)
    assert process.returncode in (0, 130) and "Traceback" not in rest, rest


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-concurrent", "0"], "--max-concurrent must be at least 1, got 0"),
        (["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
        (["--port", "70000"], "is not a port number"),
        (["--max-n", "0"], "--max-n must be at least 1"),
        (["--max-logprobs", "-1"], "--max-logprobs must be >= 0"),
        (["--max-request-bytes", "0"], "--max-request-bytes must be at least 1"),
        (["--max-batch", "0"], "--max-batch must be at least 1"),
        (["--kv-tokens", "8"], "the KV cache bound holds no sequence"),
        (["--kv-memory", "-5"], "--kv-memory must be >= 0 (0: no bound), got -5.0"),
        (["--prompt-lookup", "-1"], "--prompt-lookup must be >= 0 drafted tokens a step (0: none), got -1"),
        (["--max-batch", "100000000"], "a KV cache pool of 100,000,000 rows of 32 positions needs"),
        (["--step", "graph"], "replays CUDA graphs"),
    ],
)
def test_bad_flags_are_one_line_errors(gpt_run, capsys, flags, message) -> None:
    assert main(["serve", gpt_run, *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qkv serve: error:") and message in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["-1", "ten seconds"])
def test_a_queue_timeout_that_is_no_duration_is_one_line(gpt_run, capsys, value) -> None:
    with pytest.raises(SystemExit) as stop:  # argparse's own error, made one line by qkv's parser
        main(["serve", gpt_run, "--queue-timeout", value])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "is not a duration: give e.g. 500ms, 10s" in err


def test_a_missing_model_is_a_one_line_error(tmp_path, capsys) -> None:
    assert main(["serve", str(tmp_path / "nowhere")]) == 2
    assert "qkv serve: error:" in capsys.readouterr().err
    assert main(["serve"]) == 2
    assert "which model?" in capsys.readouterr().err
