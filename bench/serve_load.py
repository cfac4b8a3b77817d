"""Load benchmark for `qkv serve`: the batched scheduler against the one-at-a-time one, in one run.

    python bench/serve_load.py                  # GPT-2 small shape and gpt-micro, 1/4/16/64 clients, both schedulers
    python bench/serve_load.py --quick          # gpt-micro only, 1/4/16 clients, 100 fault requests (a minute or two)
    python bench/serve_load.py --presets gpt-micro --clients 1 16 --max-tokens 64
    python bench/serve_load.py --url http://127.0.0.1:8000 --clients 8   # a server already running (no faults run)

Every client is the official `openai` client, streaming. Unless --url is given, the script starts `qkv serve` as a
subprocess on a free loopback port for each model and scheduler, with a randomly initialised model from a
preset (the work per token does not depend on what the weights are) and a character tokenizer (so the
vocabulary, and the unembedding, is small: about 60 entries rather than GPT-2's 50,257). Each request asks for
exactly --max-tokens tokens (``ignore_eos``), with a temperature taken in turn from 0, 0.7 and 1.0 (seeded).
Per run: generated tokens/s and requests/s over the wall time, p50/p99 time to first token (TTFT) and time per
output token (TPOT, the mean gap between a request's tokens after the first), and errors; then the ratio of
the batched scheduler's tokens/s to the sequential one's at each client count, and the batched p99 TPOT at each
count over its single-client figure.

Faults (not with --url): --fault-requests streaming requests (1,000 by default; 100 with --quick) from 16
clients against the batched server, a third of them dropped after a few tokens; the server must answer all the
others, and its resident memory (RSS, from /proc) after the run must return to the idle figure measured after
a warm-up (the KV cache pool is allocated at start, so idle includes it). Exits 1 on any error.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = ["To be, or not to be", "The quick brown fox", "Once upon a time", "It was the best of times"]
PRESETS = {"gpt2-small": "GPT-2 small shape", "gpt-micro": "gpt-micro"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), help="model presets (gpt2-small gpt-micro)")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64], help="client counts (1 4 16 64)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (32)")
    parser.add_argument("--max-batch", type=int, default=16, help="the batched server's --max-batch (16)")
    parser.add_argument("--max-concurrent", type=int, default=2, help="the sequential server's --max-concurrent (2)")
    parser.add_argument("--schedulers", nargs="+", default=["sequential", "batched"], help="schedulers to compare")
    parser.add_argument("--fault-requests", type=int, default=1000, help="requests of the disconnect run (1000)")
    parser.add_argument("--url", help="benchmark a server that is already running at this address")
    parser.add_argument("--quick", action="store_true", help="gpt-micro, 1/4/16 clients, 100 fault requests")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the servers' --threads (all cores)")
    args = parser.parse_args(argv)
    if args.quick:
        args.presets, args.clients, args.fault_requests = ["gpt-micro"], [1, 4, 16], 100
    return args


@dataclass
class Results:
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    tokens: int = 0
    done: int = 0
    errors: list[str] = field(default_factory=list)
    wall: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


def random_model(preset: str, folder: Path) -> Path:
    """A freshly initialised model with a character tokenizer, saved as a model folder."""
    from qkv.model_dir import build_model, save_model_dir
    from qkv.models import make_config
    from qkv.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.train(" ".join(PROMPTS) + "abcdefghijklmnopqrstuvwxyz.,;:!?'\n")
    save_model_dir(folder, build_model(make_config(preset, vocab_size=tokenizer.vocab_size)), tokenizer)
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model: str, scheduler: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "qkv", "serve", model, "--port", str(port), "--log-level", "warning",
               "--scheduler", scheduler, "--max-batch", str(args.max_batch), "--max-concurrent",
               str(args.max_concurrent), "--max-tokens", str(max(args.max_tokens, 1)), "--max-prompt-tokens", "64",
               "--queue-timeout", "600", "--threads", str(args.threads)]  # fmt: skip
    # --threads: without it each server counts the cores idle at its start, and the bench's own process (or
    # the server before, still exiting) can make it pick one thread
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with code {process.returncode}: run `{' '.join(command)}` to see why")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the server did not start within 120 s")


def one_request(client, i: int, max_tokens: int, results: Results, drop_after: int | None = None) -> None:
    """One streamed completion; ``drop_after`` closes the stream after that many chunks (a client leaving)."""
    started = time.perf_counter()
    stamps: list[float] = []
    tokens = 0
    try:
        stream = client.completions.create(
            model=None, prompt=PROMPTS[i % len(PROMPTS)], max_tokens=max_tokens, temperature=(0.0, 0.7, 1.0)[i % 3],
            seed=i, stream=True, extra_body={"ignore_eos": True},
        )  # fmt: skip
        with stream:
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    stamps.append(time.perf_counter())
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                if drop_after is not None and len(stamps) >= drop_after:
                    return  # leaving: the with block closes the connection
        if tokens != max_tokens:
            raise RuntimeError(f"{tokens} tokens, not {max_tokens}")
    except Exception as error:  # noqa: BLE001 - every failure is counted and reported
        with results.lock:
            results.errors.append(f"request {i}: {type(error).__name__}: {error}")
        return
    with results.lock:
        results.done += 1
        results.tokens += tokens
        if stamps:
            results.ttft.append(stamps[0] - started)
        if len(stamps) > 1:
            results.tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))


def run_load(url: str, clients: int, requests: int, max_tokens: int, drop: float = 0.0) -> Results:
    import openai

    results = Results()
    counter = iter(range(requests))
    counter_lock = threading.Lock()
    chance = random.Random(0)

    def client_loop() -> None:
        with openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0, timeout=600) as client:
            while True:
                with counter_lock:
                    i = next(counter, None)
                    leave = chance.randint(1, 4) if chance.random() < drop else None
                if i is None:
                    return
                one_request(client, i, max_tokens, results, leave)

    results.wall = in_threads(client_loop, clients)
    return results


def in_threads(client_loop, clients: int) -> float:
    """Run ``client_loop`` in ``clients`` threads at once until all return; the wall time in seconds."""
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100)
    return ordered[int(rank) - 1]


def row(label: str, clients: int, r: Results) -> str:
    ms = lambda v: f"{1000 * v:8.1f}"  # noqa: E731
    return (
        f"{label:<11}{clients:>7}{r.tokens / r.wall:>10.1f}{r.done / r.wall:>8.2f}"
        f"{ms(percentile(r.ttft, 50))}{ms(percentile(r.ttft, 99))}{ms(percentile(r.tpot, 50))}"
        f"{ms(percentile(r.tpot, 99))}{len(r.errors):>7}"
    )


HEADER = (f"{'scheduler':<11}{'clients':>7}{'tok/s':>10}{'req/s':>8}{'TTFT50':>8}{'TTFT99':>8}{'TPOT50':>8}"
          f"{'TPOT99':>8}{'errors':>7}   (times in ms)")  # fmt: skip


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def compare(model: str, label: str, args: argparse.Namespace) -> int:
    """Every client count against each scheduler's server; the ratios; the number of errors."""
    print(f"\n{label}: {args.max_tokens} tokens per request, streamed")
    table: dict[tuple[str, int], Results] = {}
    for scheduler in args.schedulers:
        process, url = start_server(model, scheduler, args)
        try:
            info = httpx.get(url + "/v1/model", timeout=10).json()
            if scheduler == args.schedulers[0]:
                print(f"{info['kind']}, {info['parameters']:,} parameters, {info['layers']} layers, "
                      f"d_model {info['d_model']}, vocabulary {info['vocab_size']}")  # fmt: skip
                print(HEADER)
            run_load(url, 2, 2, args.max_tokens)  # warm-up, not counted
            for clients in args.clients:
                results = run_load(url, clients, max(clients, 8), args.max_tokens)
                table[scheduler, clients] = results
                print(row(scheduler, clients, results), flush=True)
                for line in results.errors[:3]:
                    print(f"    {line}")
        finally:
            process.terminate()
            process.wait(30)
    if {"batched", "sequential"} <= set(args.schedulers):
        rate = {key: r.tokens / r.wall for key, r in table.items()}
        ratios = [f"{c}: {rate['batched', c] / rate['sequential', c]:.2f}x" for c in args.clients]
        print("batched / sequential tokens/s   " + "   ".join(ratios))
    if "batched" in args.schedulers and 1 in args.clients:
        single = percentile(table["batched", 1].tpot, 99)
        spread = [f"{c}: {percentile(table['batched', c].tpot, 99) / single:.2f}x" for c in args.clients]
        print("batched p99 TPOT / 1 client's   " + "   ".join(spread))
    return sum(len(r.errors) for r in table.values())


def faults(model: str, args: argparse.Namespace) -> int:
    """Many requests, a third dropped early, against the batched server; RSS idle before and after."""
    process, url = start_server(model, "batched", args)
    try:
        run_load(url, 16, 64, args.max_tokens)  # warm-up: allocator pools and threads reach their working size
        time.sleep(1)
        idle = rss_mb(process.pid)
        results = run_load(url, 16, args.fault_requests, args.max_tokens, drop=1 / 3)
        time.sleep(2)
        after = rss_mb(process.pid)
        alive = httpx.get(url + "/health", timeout=10).json()
        dropped = args.fault_requests - results.done - len(results.errors)
        print(
            f"\nfaults: {args.fault_requests} requests from 16 clients, {dropped} dropped after 1-4 tokens; "
            f"{results.done} completed, {len(results.errors)} errors; after: {alive['active_generations']} running"
        )
        print(f"  server RSS idle {idle:.1f} MiB -> after {after:.1f} MiB ({after - idle:+.1f} MiB)")  # fmt: skip
        for line in results.errors[:3]:
            print(f"    {line}")
        return len(results.errors) + (alive["active_generations"] != 0)
    finally:
        process.terminate()
        process.wait(30)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if min(args.clients) < 1 or args.max_tokens < 1:
        raise SystemExit("--clients and --max-tokens must be at least 1")
    import torch

    print(f"qkv serve load bench: torch {torch.__version__}, {torch.get_num_threads()} threads")
    if args.url:
        url = args.url.rstrip("/")
        print(HEADER)
        errors = 0
        for clients in args.clients:
            results = run_load(url, clients, max(clients, 8), args.max_tokens)
            print(row("(running)", clients, results))
            errors += len(results.errors)
        return 1 if errors else 0
    errors = 0
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            model = str(random_model(preset, Path(tmp) / preset))
            errors += compare(model, PRESETS.get(preset, preset), args)
        if args.fault_requests:
            errors += faults(str(random_model("gpt-micro", Path(tmp) / "faults")), args)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
