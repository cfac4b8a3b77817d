"""Benchmark: the compiled decode step against the eager ones, on SmolLM2-135M-Instruct in float32.

    python bench/compiled_step.py            # batch 1 and 8, 3 rounds (2-10 minutes: compiling comes first)
    python bench/compiled_step.py --quick    # batch 1, 16 new tokens, one round

Two processes, one after the other, each timing its steps in turn, round by round, through the decoding engine
(``Engine``, greedy, a 32-token prompt):

- without the C library (``QKV_NATIVE=0``, as on a machine without a C compiler, or for a model the native step
  does not take): ``static``, the PyTorch step run eagerly, against ``compiled``, that step through
  ``torch.compile``;
- with it: ``native``, the step in one call to C, against ``compiled``, the graph that holds that call as one
  operator.

For each it prints the milliseconds per decoding step (median over the rounds, the range in brackets), the ratio
compiled / eager, and how long the first call took, which is where the compiling happens, and whether Inductor's
on-disk cache held graphs before the run (a second run reads them from there). Each process checks that both
steps gave the same tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from llamacpp import shipped_file  # noqa: E402
from qkv_peer import decode  # noqa: E402

PAIRS = {"pytorch": ("static", "compiled"), "native": ("native", "compiled")}


def inductor_cache() -> Path:
    """Where Inductor keeps compiled graphs between runs (TORCHINDUCTOR_CACHE_DIR, else its default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def measure(pair: str, batches: list[int], new: int, rounds: int) -> dict:
    """The figures of one process: for each batch, each step's seconds per step over the rounds."""
    import torch

    import qkv

    torch.set_num_threads(2)
    model = qkv.load(str(shipped_file()), dequantize=True).model.eval()
    prompt = list(range(100, 132))
    figures: dict = {"cache_held": any(inductor_cache().glob("**/*.py")), "batches": {}}
    for batch in batches:
        prompts = [[token + row for token in prompt] for row in range(batch)]
        times: dict[str, list[float]] = {step: [] for step in PAIRS[pair]}
        first: dict[str, float] = {}
        tokens: dict[str, list[list[int]]] = {}
        for step in PAIRS[pair]:  # the first call of each (the same shapes as the timed ones): compiling
            start = time.perf_counter()
            decode(model, prompts, new, step)
            first[step] = time.perf_counter() - start
        for _ in range(rounds):
            for step in PAIRS[pair]:
                run = decode(model, prompts, new, step)  # the engine's loop, as bench/llamacpp.py times it
                tokens[step] = run["ids"]
                times[step].append(run["decode_s"] / max(new - 1, 1))  # the first new token comes with the prompt
        steps = list(PAIRS[pair])
        figures["batches"][batch] = {"times": times, "first": first, "same": tokens[steps[0]] == tokens[steps[1]]}
    return figures


def report(pair: str, figures: dict) -> list[str]:
    eager, compiled = PAIRS[pair]
    cache = "held graphs before the run" if figures["cache_held"] else "was empty before the run"
    lines = [f"{'without' if pair == 'pytorch' else 'with'} the C library; Inductor's cache {cache}"]
    for batch, got in figures["batches"].items():
        ms = {step: [1000 * s for s in got["times"][step]] for step in (eager, compiled)}
        median = {step: statistics.median(values) for step, values in ms.items()}
        ratio = median[eager] / median[compiled]
        spread = {step: f"{min(v):.1f}-{max(v):.1f}" for step, v in ms.items()}
        lines.append(
            f"  batch {batch}: {eager} {median[eager]:.1f} ms/step ({spread[eager]}), {compiled} "
            f"{median[compiled]:.1f} ({spread[compiled]}): compiled is {ratio:.2f}x as fast; "
            f"first call {got['first'][compiled]:.1f} s compiled, {got['first'][eager]:.1f} s {eager}; "
            f"same tokens: {got['same']}"
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 1, 16 new tokens, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--child", choices=tuple(PAIRS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    batches, new, rounds = ([1], 16, 1) if args.quick else ([1, 8], args.new_tokens, args.rounds)
    if args.child:
        print(json.dumps(measure(args.child, batches, new, rounds)))
        return
    print(f"SmolLM2-135M-Instruct, float32, 2 threads, 32-token prompt, {new} greedy tokens, {rounds} round(s)")
    for pair in PAIRS:
        env = {name: value for name, value in os.environ.items() if name != "QKV_NATIVE"}
        env.update({"QKV_NATIVE": "0"} if pair == "pytorch" else {})
        with tempfile.TemporaryFile("w+") as out:
            command = [sys.executable, __file__, "--child", pair, "--rounds", str(rounds), "--new-tokens", str(new)]
            subprocess.run(command + (["--quick"] if args.quick else []), env=env, stdout=out, check=True)
            out.seek(0)
            figures = json.loads(out.read().strip().splitlines()[-1])
        print("\n".join(report(pair, figures)), flush=True)


if __name__ == "__main__":
    main()
