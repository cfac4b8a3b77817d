"""Benchmark: generation speed with the KV cache and without it, same model, same run.

    python bench/generate.py             # gpt-small-cpu (6 layers, 256 wide, 8 heads, 1024 context)
    python bench/generate.py --quick     # smaller lengths, a smoke run of a few seconds
    python bench/generate.py --preset gpt-mini --lengths 32+64 64+64

Without a cache every new token re-runs the model over the whole sequence so far (O(L) tokens of work per
step, O(L^2) per sequence); with it, each step feeds one token and attends to the cached keys and values.
Greedy decoding makes both paths produce the same tokens, which the script checks. Random weights are fine:
the work per token does not depend on what the weights are.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch

from qkv.decoding import generate
from qkv.models import GPT, make_config
from qkv.models import family as families

DEFAULT_LENGTHS = ((64, 256), (512, 512))
QUICK_LENGTHS = ((16, 32), (64, 64))


@dataclass
class Measurement:
    """Tokens per second for one prompt + generation length, with and without the KV cache."""

    prompt_length: int
    new_tokens: int
    cached_seconds: float
    uncached_seconds: float
    same_tokens: bool

    @property
    def cached_tokens_per_second(self) -> float:
        return self.new_tokens / self.cached_seconds

    @property
    def uncached_tokens_per_second(self) -> float:
        return self.new_tokens / self.uncached_seconds

    @property
    def speedup(self) -> float:
        return self.uncached_seconds / self.cached_seconds


def build_model(preset: str = "gpt-small-cpu", vocab_size: int = 256, seed: int = 0) -> GPT:
    """A GPT with random weights from a named preset, in eval mode."""
    torch.manual_seed(seed)
    config = make_config(preset, vocab_size=vocab_size, dropout=0.0)
    if families.family_of(config).role != families.LANGUAGE_MODEL:
        sys.exit(f"{preset} is not a language model's preset")
    return cast(GPT, families.build_model(config)).eval()  # a GPT or Llama: both decode as the GPT class's interface


def measure(model: GPT, prompt_length: int, new_tokens: int, *, seed: int = 0, engine: str = "auto") -> Measurement:
    """Time greedy generation of ``new_tokens`` after a random prompt, cached (with ``engine``) then uncached."""
    prompt = torch.randint(model.config.vocab_size, (1, prompt_length), generator=torch.Generator().manual_seed(seed))
    generate(model, prompt[:, :4], max_new_tokens=4, temperature=0, step=engine)  # warm-up: first-call costs
    outputs, seconds = [], []
    for use_cache in (True, False):
        start = time.perf_counter()
        outputs.append(
            generate(model, prompt, max_new_tokens=new_tokens, temperature=0, use_cache=use_cache, step=engine)
        )
        seconds.append(time.perf_counter() - start)
    return Measurement(prompt_length, new_tokens, seconds[0], seconds[1], torch.equal(outputs[0], outputs[1]))


def _parse_length(text: str) -> tuple[int, int]:
    try:
        prompt, new = (int(part) for part in text.split("+"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not PROMPT+NEW, e.g. 64+256") from None
    return prompt, new


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt-small-cpu", help="model preset (default: gpt-small-cpu)")
    parser.add_argument("--vocab-size", type=int, default=256, help="vocabulary size (default: 256)")
    parser.add_argument("--quick", action="store_true", help=f"lengths {QUICK_LENGTHS} for a smoke run")
    parser.add_argument("--lengths", nargs="+", type=_parse_length, metavar="PROMPT+NEW", help="lengths to time")
    parser.add_argument("--engine", default="auto", help="decoding engine of the cached path (default: auto)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    model = build_model(args.preset, args.vocab_size)
    lengths = args.lengths or (QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
    context = model.config.context_length
    too_long = [f"{p}+{n}" for p, n in lengths if p + n > context]
    if too_long:
        print(f"note: {', '.join(too_long)} run past the {context}-token context, where caching saves nothing")

    c = model.config
    print(
        f"{args.preset}: {c.n_layers} layers, d_model={c.d_model}, {c.n_heads} heads, context {context}, "
        f"vocab {c.vocab_size}, {model.num_parameters() / 1e6:.1f}M parameters; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; greedy decoding; engine {args.engine}"
    )
    header = f"{'prompt+new':>11} | {'cached tok/s':>12} | {'uncached tok/s':>14} | {'speed-up':>8} | same tokens"
    print(header)
    print("-" * len(header))
    for prompt_length, new_tokens in lengths:
        m = measure(model, prompt_length, new_tokens, engine=args.engine)
        print(
            f"{f'{prompt_length}+{new_tokens}':>11} | {m.cached_tokens_per_second:12.1f} | "
            f"{m.uncached_tokens_per_second:14.1f} | {m.speedup:7.1f}x | {'yes' if m.same_tokens else 'NO'}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
