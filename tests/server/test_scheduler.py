"""The batched scheduler (continuous batching) against its references: every response equals the request's solo
run (generate() in this process, or the same request on a one-at-a-time server), whatever runs beside it; a
client that leaves frees its rows within one step; a failing request fails alone; the pool bound queues and
refuses; /metrics is Prometheus text whose counters move."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator

import pytest
import torch

from qkv.decoding import generate
from qkv.errors import QkvError
from qkv.loading import load
from qkv.server import Limits, create_app
from tests.server.conftest import Served, error_of, serve

openai = pytest.importorskip("openai", reason="the openai client is a test dependency: pip install -e '.[test]'")

PROMPTS = ["To be, or", "Whether 'tis nobler in", "T", "Or to take arms against a sea"]


@pytest.fixture(scope="module")
def batched(gpt_run) -> Iterator[Served]:
    limits = Limits(max_prompt_tokens=200, max_tokens=300, max_batch=6, max_logprobs=1000, queue_timeout=60)
    yield from serve(gpt_run, limits)


@pytest.fixture(scope="module")
def sequential(gpt_run) -> Iterator[Served]:
    limits = Limits(max_prompt_tokens=200, max_tokens=300, max_concurrent=1, queue_timeout=60)
    yield from serve(gpt_run, limits, scheduler="sequential")


def post(served: Served, **body) -> dict:
    response = served.client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def greedy(served: Served, prompt: str, n: int) -> str:
    """generate() at temperature 0 in this process: the solo run, with no server in between."""
    tokenizer = served.bundle.tokenizer
    ids = tokenizer.encode(prompt)
    out = generate(served.bundle.model, ids, max_new_tokens=n, temperature=0, eos_id=tokenizer.eos_id)
    new = [t for t in out[0, len(ids) :].tolist() if t != tokenizer.eos_id]
    return tokenizer.decode(new)


def at_once(work: list, run) -> list:
    """Run ``run(item)`` for every item in its own thread, all started together; the results in order."""
    results: list = [None] * len(work)
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def one(i: int) -> None:
        try:
            start.wait()
            results[i] = run(work[i])
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return results


def test_greedy_responses_of_many_concurrent_openai_clients_equal_their_solo_runs(batched) -> None:
    assert batched.client.get("/health").json()["scheduler"] == "batched"
    with openai.OpenAI(base_url=batched.url + "/v1", api_key="-", max_retries=0, timeout=60) as client:

        def ask(i: int) -> str:
            prompt, n = PROMPTS[i % 4], 6 + 3 * (i % 5)
            if i % 2:
                chunks = client.completions.create(model=None, prompt=prompt, max_tokens=n, temperature=0, stream=True)
                return "".join(c.choices[0].text for c in chunks if c.choices)
            return client.completions.create(model=None, prompt=prompt, max_tokens=n, temperature=0).choices[0].text

        texts = at_once(list(range(16)), ask)  # 16 clients, 6 rows: the batch fills, others wait and join
    for i, text in enumerate(texts):
        assert text == greedy(batched, PROMPTS[i % 4], 6 + 3 * (i % 5)), i


def test_seeded_and_mixed_requests_in_one_batch_equal_their_solo_runs_on_the_sequential_server(
    batched, sequential
) -> None:
    bodies = [
        dict(prompt=PROMPTS[0], max_tokens=20, temperature=1.1, seed=3, ignore_eos=True),
        dict(prompt=PROMPTS[1], max_tokens=15, temperature=0.8, top_k=5, seed=4, n=3, logprobs=2),
        dict(prompt=PROMPTS[2], max_tokens=40, temperature=0, stop=["\n", "e, "], logprobs=1, echo=True),
        dict(prompt=PROMPTS[3], max_tokens=25, temperature=1.3, top_p=0.9, seed=5, stop="o"),
        dict(prompt=[PROMPTS[0], PROMPTS[2]], max_tokens=12, temperature=0.9, seed=6, n=2),
        dict(prompt=PROMPTS[1] * 3, max_tokens=30, temperature=0.7, seed=7),  # past the context: the window slides
    ]
    solo = [post(sequential, **body) for body in bodies]
    for _ in range(2):  # twice, with different neighbours each time (the order the threads get in differs)
        together = at_once(bodies + bodies[::-1], lambda body: post(batched, **body))
        for got, want in zip(together, solo + solo[::-1], strict=True):
            assert got["usage"] == want["usage"]
            for mine, theirs in zip(got["choices"], want["choices"], strict=True):
                same_choice(mine, theirs)


def same_choice(got: dict, want: dict) -> None:
    """The same text, tokens and finish; logprobs equal to float32 rounding (a batch of rows sums in another
    order than one row)."""
    assert {k: got[k] for k in ("text", "index", "finish_reason")} == {k: want[k] for k in ("text", "index",
                                                                                         "finish_reason")}  # fmt: skip
    if want["logprobs"] is None:
        assert got["logprobs"] is None
        return
    a, b = got["logprobs"], want["logprobs"]
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-5)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
        assert x == y if x is None else (set(x) == set(y) and list(x.values()) == pytest.approx(list(y.values()),
                                                                                                abs=1e-5))  # fmt: skip


def test_a_client_that_disconnects_mid_stream_frees_its_rows_within_one_step(batched) -> None:
    scheduler = batched.server.app.state.service.scheduler
    cancelled_at: list[int] = []
    body = {"prompt": PROMPTS[0], "max_tokens": 250, "temperature": 0.5, "ignore_eos": True, "stream": True, "n": 2}
    with batched.client.stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: {"):
            pass
        for _ in range(2000):  # the loop adds the two rows one after the other
            rows = list(scheduler.engine.requests)
            if len(rows) == 2:
                break
            threading.Event().wait(0.001)
        assert len(rows) == 2
        job = rows[0].tag.job
        cancel = job.cancel
        job.cancel = lambda: (cancelled_at.append(scheduler.steps), cancel())  # note the step it happened at
    for _ in range(2000):
        if not scheduler.engine.running:
            break
        threading.Event().wait(0.01)
    assert not scheduler.engine.running and cancelled_at
    assert all(row.tag.left_at_step - cancelled_at[0] <= 1 for row in rows), (cancelled_at, rows[0].tag.left_at_step)
    assert rows[0].tag.job.completion_tokens < 2 * 250  # both choices stopped early


def test_a_request_that_raises_fails_alone_and_the_batch_goes_on(batched, monkeypatch) -> None:
    from qkv.decoding import engine
    from qkv.decoding import text as output

    push, penalize = output.StopText.push, engine.penalize

    def failing_push(self, piece: str) -> str:  # in the handler, off the model thread
        if "BOOM" in self.stops:
            raise ValueError("this stop string cannot be checked")
        return push(self, piece)

    def failing_penalize(logits, params, counts, seen):  # in the engine, on the model thread
        if params.repetition_penalty == 1.25:
            raise ValueError("this penalty cannot be applied")
        return penalize(logits, params, counts, seen)

    monkeypatch.setattr(output.StopText, "push", failing_push)
    monkeypatch.setattr(engine, "penalize", failing_penalize)
    good = dict(prompt=PROMPTS[0], max_tokens=30, temperature=0)
    bodies = [good, dict(good, repetition_penalty=1.25), good, dict(good, stop="BOOM", stream=True), good]

    def send(body: dict) -> tuple[int, str]:
        response = batched.client.post("/v1/completions", json=body)
        return response.status_code, response.text

    results = at_once(bodies, send)
    expected = greedy(batched, PROMPTS[0], 30)
    for i in (0, 2, 4):
        assert results[i][0] == 200 and json.loads(results[i][1])["choices"][0]["text"] == expected
    assert results[1][0] == 500 and "this penalty cannot be applied" in results[1][1]
    assert results[3][0] == 200 and "generation failed: this stop string cannot be checked" in results[3][1]
    assert post(batched, **good)["choices"][0]["text"] == expected  # and the loop still runs


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus' text format, strictly: HELP and TYPE before each family, then ``name{labels} value``."""
    samples, typed = {}, {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_]\w*="[^"]*"(,[a-zA-Z_]\w*="[^"]*")*)?\})? (\S+)$')
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "histogram"), line
            typed[name] = kind
            continue
        match = sample.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name = match.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert family in typed, f"{name} has no # TYPE line before it"
        samples[name + (match.group(2) or "")] = float(match.group(5))
    return samples


def test_metrics_are_prometheus_text_and_move_with_the_requests(batched) -> None:
    def scrape() -> dict[str, float]:
        response = batched.client.get("/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return parse_prometheus(response.text)

    before = scrape()
    post(batched, prompt=PROMPTS[0], max_tokens=7, temperature=0, ignore_eos=True)
    post(batched, prompt=PROMPTS[1], max_tokens=5, temperature=0, ignore_eos=True, n=2)
    after = scrape()
    assert after["qkv_generation_tokens_total"] - before["qkv_generation_tokens_total"] == 17
    assert after['qkv_requests_total{status="ok"}'] - before['qkv_requests_total{status="ok"}'] == 2
    for histogram in ("qkv_time_to_first_token_seconds", "qkv_time_per_output_token_seconds"):
        assert after[histogram + "_count"] - before[histogram + "_count"] == 2
        assert after[histogram + '_bucket{le="+Inf"}'] == after[histogram + "_count"]
    assert after["qkv_kv_cache_slots"] == 6 and after["qkv_kv_cache_slots_used"] == 0
    assert after["qkv_requests_running"] == after["qkv_requests_waiting"] == 0
    assert after["qkv_kv_cache_bytes"] > 0


def test_a_50_mb_prompt_is_refused_before_it_reaches_the_scheduler(batched) -> None:
    scheduler = batched.server.app.state.service.scheduler
    steps, passes = scheduler.steps, scheduler.passes
    body = json.dumps({"prompt": "x" * 50_000_000, "max_tokens": 5}).encode()
    response = batched.client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert "request body" in error_of(response, 413)
    assert (scheduler.steps, scheduler.passes) == (steps, passes)


def test_the_pool_bound_makes_requests_wait_and_503_after_the_queue_timeout(gpt_run) -> None:
    for served in serve(gpt_run, Limits(max_tokens=100_000, max_batch=1, queue_timeout=0.5)):
        body = {"prompt": PROMPTS[0], "max_tokens": 100_000, "temperature": 0, "ignore_eos": True, "stream": True}
        with served.client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()  # kept: dropping the iterator would close the connection
            assert next(lines).startswith("data: {")  # it holds the one row
            message = error_of(served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}), 503)
            assert "busy" in message and "--max-batch" in message
            assert "qkv_requests_running 1.0" in served.client.get("/metrics").text


def test_a_waiting_request_runs_once_a_row_frees(gpt_run) -> None:
    for served in serve(gpt_run, Limits(max_tokens=300, max_batch=1, queue_timeout=60)):
        bodies = [dict(prompt=p, max_tokens=40, temperature=0, ignore_eos=True) for p in PROMPTS[:3]]
        texts = at_once(bodies, lambda body, served=served: post(served, **body)["choices"][0]["text"])
        assert texts == [greedy(served, p, 40) for p in PROMPTS[:3]]


def test_every_cpu_step_serves_the_batch_and_the_pool_bounds_are_checked_with_the_fix(gpt_run) -> None:
    bundle = load(gpt_run)
    for step in ("model", "static", "compiled"):  # the batched scheduler runs every strategy the device has
        scheduler = create_app(bundle, step=step).state.service.scheduler
        assert scheduler.name == "batched" and scheduler.engine.mode == step
    with pytest.raises(QkvError, match="replays CUDA graphs"):
        create_app(bundle, step="graph")
    with pytest.raises(QkvError, match="raise --kv-tokens/--kv-memory"):
        create_app(bundle, Limits(kv_tokens=10))
    app = create_app(bundle, Limits(max_batch=64, kv_memory_mb=0.05), step="static")
    assert 0 < app.state.service.scheduler.engine.slots < 64
    assert create_app(bundle, scheduler="sequential", step="model").state.service.scheduler.name == "sequential"


def test_the_log_line_of_a_request_names_its_timings(batched, caplog) -> None:
    with caplog.at_level("INFO", logger="qkv.serve"):
        data = post(batched, prompt=PROMPTS[0], max_tokens=4, temperature=0, ignore_eos=True)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "qkv.serve"]
    assert line.startswith(f"completion {data['id']} status=ok scheduler=batched prompt_tokens=9 completion_tokens=4")
    assert all(f" {key}=" in line and "ms" in line for key in ("queue", "ttft", "tpot", "total"))


def test_the_llama_family_batches_with_grouped_query_attention(tmp_path) -> None:
    from qkv.model_dir import save_model_dir
    from qkv.models import LlamaConfig
    from qkv.models.llama import Llama
    from qkv.tokenizers import CharTokenizer
    from tests.server.conftest import TEXT

    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_kv_heads=2, n_layers=2,
                         context_length=48, init_std=0.5)  # fmt: skip
    path = save_model_dir(tmp_path / "llama", Llama(config), tokenizer)
    for served in serve(str(path), Limits(max_batch=4)):
        bodies = [dict(prompt=p, max_tokens=20, temperature=0) for p in PROMPTS]
        texts = at_once(bodies, lambda body, served=served: post(served, **body)["choices"][0]["text"])
        assert texts == [greedy(served, p, 20) for p in PROMPTS]
