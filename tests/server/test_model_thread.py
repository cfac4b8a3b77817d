"""The model thread (qkv.server.model_thread): jobs run one after another in one thread, in the caller's context,
taking turns with a background loop; every forward pass of a running server happens there; and an OpenMP
team can be given back without breaking torch."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time

import pytest
import torch

from qkv.server.model_thread import ModelThread, release_openmp_threads
from tests.server.conftest import serve

flavour: contextvars.ContextVar[str] = contextvars.ContextVar("flavour", default="none")


def test_jobs_run_in_one_thread_in_order_with_the_callers_context_and_errors() -> None:
    worker = ModelThread(name="qkv-model-test")
    seen: list[tuple[str, int, str]] = []

    def job(i: int) -> int:
        seen.append((threading.current_thread().name, i, flavour.get()))
        return i * i

    async def main() -> list:
        flavour.set("request")
        results = await asyncio.gather(*(worker.run(job, i) for i in range(5)))
        with pytest.raises(ZeroDivisionError):
            await worker.run(lambda: 1 / 0)
        return results

    try:
        assert asyncio.run(main()) == [0, 1, 4, 9, 16]
        assert seen == [("qkv-model-test", i, "request") for i in range(5)]
    finally:
        worker.stop()


def test_jobs_and_background_steps_take_turns() -> None:
    worker = ModelThread()
    order: list[str] = []
    steps = {"left": 3}

    def has_work() -> bool:
        return steps["left"] > 0

    def run_once() -> None:
        steps["left"] -= 1
        order.append("step")
        time.sleep(0.01)

    with worker.cond:  # queue two jobs before the thread can look, then let the background start too
        worker.attach(has_work, run_once)
        futures = [worker.submit(order.append, "job") for _ in range(2)]
    for future in futures:
        future.result(timeout=10)
    deadline = time.monotonic() + 10
    while steps["left"] and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop()
    assert order.count("step") == 3 and order.count("job") == 2
    assert order[:4] in (["job", "step", "job", "step"], ["step", "job", "step", "job"])  # neither waits for all


def test_a_served_model_computes_only_on_the_model_thread(translator_run, monkeypatch) -> None:
    from qkv.server.routes import views
    from qkv.server.service import Service

    threads: set[str] = set()
    for owner, name in ((Service, "translate_texts"), (views, "next_token_view")):
        original = getattr(owner, name)

        def spy(*args, _original=original, **kwargs):
            threads.add(threading.current_thread().name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)
    for served in serve(translator_run):
        assert served.client.post("/v1/translations", json={"text": "one two", "beam": 2}).status_code == 200
        assert served.client.post("/v1/next-token", json={"prompt": "one two", "target": "TW"}).status_code == 200
    assert threads == {"qkv-model"}


def test_releasing_the_openmp_team_leaves_torch_working() -> None:
    x = torch.randn(512, 512)
    before = x @ x
    assert isinstance(release_openmp_threads(), bool)
    torch.testing.assert_close(x @ x, before)  # a new team is made on demand
