"""Load benchmark for `qkv serve`'s /v1/translations: requests translated together (batched) against one at a
time (sequential), in one run.

    python bench/serve_translations.py                      # transformer-base shape, 1/4/16 clients, beam 4
    python bench/serve_translations.py --quick              # transformer-mini, 1/4 clients
    python bench/serve_translations.py --preset transformer-mini --clients 1 8 --beam 1

For each scheduler the script starts `qkv serve` on a free loopback port with a randomly initialised
translator from a preset (character tokenizers, so the vocabularies are small) and sends, from each number of
concurrent clients (threads with httpx), max(2 x clients, 8) requests of one sentence each (18-31 characters,
in turn from a fixed list) with the same beam width. A random model rarely ends a translation early, so
each runs to its length bound (1.5 x the source + 10 tokens): the work per sentence is fixed. Per run:
sentences/s over the wall time, p50/p99 latency, errors; then the batched/sequential ratio at each client
count, and how many translations the two servers gave alike (a near tie can differ: a batch sums in another
order). Exits 1 on any error.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import in_threads, percentile, start_server  # noqa: E402  (a sibling script)

SENTENCES = [
    "the cat sat on the mat.",
    "a man is eating an apple.",
    "two dogs run in the park.",
    "she reads a book at night.",
    "the children play by the river.",
    "we walk to the old market.",
    "he writes a letter home.",
    "the train leaves at noon.",
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="transformer-base", help="translator preset (transformer-base)")
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16], help="client counts (1 4 16)")
    parser.add_argument("--beam", type=int, default=4, help="beam width of every request (4)")
    parser.add_argument("--max-batch", type=int, default=64, help="the batched server's --max-batch, in rows (64)")
    parser.add_argument("--quick", action="store_true", help="transformer-mini, 1 and 4 clients")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="the servers' --threads (all cores)")
    args = parser.parse_args(argv)
    if args.quick:
        args.preset, args.clients = "transformer-mini", [1, 4]
    args.max_concurrent, args.max_tokens = 2, 1  # what start_server reads besides --max-batch and --threads
    return args


def random_translator(preset: str, folder: Path) -> Path:
    from qkv.model_dir import build_model, save_model_dir
    from qkv.models import make_config
    from qkv.tokenizers import CharTokenizer

    tokenizer = CharTokenizer.train(" ".join(SENTENCES) + "abcdefghijklmnopqrstuvwxyz.,")
    config = make_config(preset, src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size)
    save_model_dir(folder, build_model(config), tokenizer, tokenizer)
    return folder


def run_load(url: str, clients: int, requests: int, beam: int) -> dict:
    """``requests`` translations from ``clients`` threads; latencies, outputs by sentence, errors, wall time."""
    latencies: list[float] = []
    outputs: dict[str, str] = {}
    errors: list[str] = []
    counter = iter(range(requests))
    lock = threading.Lock()

    def client_loop() -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                sentence = SENTENCES[i % len(SENTENCES)]
                started = time.perf_counter()
                try:
                    response = client.post("/v1/translations", json={"text": sentence, "beam": beam})
                    response.raise_for_status()
                    text = response.json()["translations"][0]["text"]
                except Exception as error:  # noqa: BLE001 - counted and reported
                    with lock:
                        errors.append(f"request {i}: {type(error).__name__}: {error}")
                    continue
                with lock:
                    latencies.append(time.perf_counter() - started)
                    outputs[sentence] = text

    wall = in_threads(client_loop, clients)
    return {"wall": wall, "latencies": latencies, "outputs": outputs, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    print(f"qkv serve translations bench: torch {torch.__version__}, {torch.get_num_threads()} threads")
    table: dict[tuple[str, int], dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = str(random_translator(args.preset, Path(tmp) / args.preset))
        print(f"{args.preset} (random weights), beam {args.beam}, one sentence per request")
        print(f"{'scheduler':<11}{'clients':>7}{'sent/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>7}")
        for scheduler in ("sequential", "batched"):
            process, url = start_server(model, scheduler, args)
            try:
                run_load(url, 2, 2, args.beam)  # warm-up, not counted
                for clients in args.clients:
                    r = run_load(url, clients, max(2 * clients, 8), args.beam)
                    table[scheduler, clients] = r
                    ms = [1000 * percentile(r["latencies"], q) for q in (50, 99)]
                    print(
                        f"{scheduler:<11}{clients:>7}{len(r['latencies']) / r['wall']:>9.2f}{ms[0]:>9.0f}{ms[1]:>9.0f}"
                        f"{len(r['errors']):>7}",
                        flush=True,
                    )
                    for line in r["errors"][:3]:
                        print(f"    {line}")
            finally:
                process.terminate()
                process.wait(30)
    rate = {key: len(r["latencies"]) / r["wall"] for key, r in table.items()}
    print("batched / sequential sentences/s   " + "   ".join(
        f"{c}: {rate['batched', c] / rate['sequential', c]:.2f}x" for c in args.clients))  # fmt: skip
    alike = total = 0
    for c in args.clients:
        for sentence, text in table["batched", c]["outputs"].items():
            other = table["sequential", c]["outputs"].get(sentence)
            if other is not None:
                total += 1
                alike += other == text
    print(f"translations alike on both servers: {alike} of {total}")
    return 1 if any(r["errors"] for r in table.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
