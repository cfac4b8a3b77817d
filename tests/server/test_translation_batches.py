"""Translations batched across requests (qkv.server.translations): concurrent requests get the translations
the Translator gives each of them alone, in fewer batches than requests; the queue groups by beam width and
bounds the rows; a failing batch is retried so only the bad request fails; a request that cannot start in
time gets 503; one that left is never translated."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator

import pytest

from qkv.decoding.translator import Translator
from qkv.server import Limits
from qkv.server.errors import ServiceError
from qkv.server.translation_batches import TranslationBatches
from tests.server.conftest import Served, serve

REQUESTS = [
    ("one two three", 1),
    (["four five", "six seven eight"], 3),
    ("nine ten", 3),
    (["two one", "three"], 1),
    ("five six seven eight", 3),
    ("ten nine eight", 1),
    (["seven", "one four"], 3),
    ("eight two six", 3),
]


@pytest.fixture(scope="module")
def batched(translator_run) -> Iterator[Served]:
    yield from serve(translator_run, Limits(max_batch=64, queue_timeout=60))


@pytest.fixture(scope="module")
def sequential(translator_run) -> Iterator[Served]:
    yield from serve(translator_run, Limits(queue_timeout=60), scheduler="sequential")


def translate_all_at_once(served: Served) -> list[list[str]]:
    results: list = [None] * len(REQUESTS)
    start = threading.Barrier(len(REQUESTS))

    def one(i: int) -> None:
        text, beam = REQUESTS[i]
        start.wait()
        response = served.client.post("/v1/translations", json={"text": text, "beam": beam})
        assert response.status_code == 200, response.text
        results[i] = [t["text"] for t in response.json()["translations"]]

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


@pytest.mark.parametrize("which", ["batched", "sequential"])
def test_concurrent_translations_equal_each_request_alone(which, request) -> None:
    served: Served = request.getfixturevalue(which)
    reference = Translator.from_bundle(served.bundle)
    service = served.server.app.state.service
    before = service.translations.batches if service.translations else 0
    got = translate_all_at_once(served)
    for (text, beam), translations in zip(REQUESTS, got, strict=True):
        sentences = [text] if isinstance(text, str) else text
        assert translations == [reference.translate([s], beam=beam)[0] for s in sentences], (text, beam)
    if which == "batched":
        batches = service.translations.batches - before
        assert 2 <= batches < len(REQUESTS)  # two beam widths: at least two batches; fewer than one per request
    else:
        assert service.translations is None
    metrics = served.client.get("/metrics").text
    ok = re.search(r'^qkv_translation_requests_total\{status="ok"\} (\d+)$', metrics, re.M)
    sentences = re.search(r"^qkv_translated_sentences_total (\d+)$", metrics, re.M)
    assert ok and int(ok.group(1)) >= len(REQUESTS)
    assert sentences and int(sentences.group(1)) >= sum(1 if isinstance(t, str) else len(t) for t, _ in REQUESTS)


# ------------------------------------------------------------------------ the queue, with a fake model


def run_queue(batches: TranslationBatches, requests: list[tuple[list[str], int]], stagger: float = 0.0) -> list:
    """Every request through ``batches`` concurrently; each result, or the exception it raised."""

    async def main() -> list:
        async def one(texts: list[str], beam: int, delay: float):
            await asyncio.sleep(delay)
            return await batches.translate(texts, beam)

        jobs = [one(texts, beam, i * stagger) for i, (texts, beam) in enumerate(requests)]
        return await asyncio.gather(*jobs, return_exceptions=True)

    return asyncio.run(main())


def test_the_queue_groups_by_beam_bounds_rows_and_keeps_order() -> None:
    calls: list[tuple[list[str], int]] = []

    def fake(texts: list[str], beam: int) -> list[str]:
        calls.append((list(texts), beam))
        time.sleep(0.05)
        return [t.upper() for t in texts]

    batches = TranslationBatches(fake, max_rows=8, timeout=10)
    requests = [(["a"], 2), (["b", "c"], 2), (["d"], 1), (["e"], 2), (["f", "g"], 2), (["h"], 1)]
    results = run_queue(batches, requests)
    assert results == [[t.upper() for t in texts] for texts, _ in requests]
    # all six queue before the task first runs: beam 2 takes a, b c, e (4 sentences x 2 = 8 rows; f g would
    # pass 8), then beam 1 takes d and h, then f g
    assert calls == [(["a", "b", "c", "e"], 2), (["d", "h"], 1), (["f", "g"], 2)]
    assert batches.batches == 3 and not batches.waiting


def test_a_request_larger_than_the_bound_still_runs_alone() -> None:
    calls = []
    batches = TranslationBatches(lambda texts, beam: calls.append(texts) or list(texts), max_rows=4, timeout=10)
    assert run_queue(batches, [(["a", "b", "c"], 4), (["d"], 4)]) == [["a", "b", "c"], ["d"]]
    assert calls == [["a", "b", "c"], ["d"]]


def test_a_failing_batch_is_retried_so_only_the_bad_request_fails() -> None:
    def fake(texts: list[str], beam: int) -> list[str]:
        if "bad" in texts:
            raise ValueError("this sentence breaks the model")
        return [t + "!" for t in texts]

    batches = TranslationBatches(fake, max_rows=100, timeout=10)
    results = run_queue(batches, [(["x"], 1), (["bad"], 1), (["y", "z"], 1)])
    assert results[0] == ["x!"] and results[2] == ["y!", "z!"]
    assert isinstance(results[1], ValueError)


def test_a_request_that_cannot_start_in_time_gets_503_and_is_never_run() -> None:
    ran = []

    def slow(texts: list[str], beam: int) -> list[str]:
        ran.append(list(texts))
        time.sleep(0.5)
        return list(texts)

    batches = TranslationBatches(slow, max_rows=1, timeout=0.2)  # one sentence per batch
    results = run_queue(batches, [(["first"], 1), (["second"], 1)], stagger=0.01)
    assert results[0] == ["first"]
    assert isinstance(results[1], ServiceError) and results[1].status == 503
    assert "busy" in str(results[1]) and ran == [["first"]]
