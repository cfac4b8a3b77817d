"""Where a decode step's time goes: operators per token and milliseconds in matrix products vs the rest.

GPT-2 small (random weights, fp32, CPU), a 32-token prompt, then one-token steps of the decoding engine, profiled
with torch.profiler for each step strategy: "model" (the model's own forward with the KV cache, the reference),
"static" (the fixed-shape step) and "native" (the whole step in one call to C, the CPU's default). For each it
prints

- operators per token: those called from Python (what the step itself dispatches) and all of them
  (operators that call others count each time), with the view-like ones (view, reshape, transpose,
  slice, ...) and concatenations among them;
- milliseconds per token: the self time of the matrix products (bmm, baddbmm, mm, addmm, ...) and of
  everything else, and the wall time of a step.

    python bench/decode_profile.py               # batch 1 and 8
    python bench/decode_profile.py --quick       # a 2-layer model, batch 1
"""

from __future__ import annotations

import argparse
import collections
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

MATMUL = {
    "aten::bmm",
    "aten::baddbmm",
    "aten::addmm",
    "aten::mm",
    "aten::mv",
    "aten::addmv",
    "aten::_weight_int8pack_mm",
}
VIEWS = {
    "aten::view",
    "aten::reshape",
    "aten::transpose",
    "aten::permute",
    "aten::expand",
    "aten::slice",
    "aten::select",
    "aten::unbind",
    "aten::t",
    "aten::numpy_T",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::as_strided",
    "aten::_reshape_alias",
    "aten::split",
    "aten::chunk",
}


def profile_engine(model: torch.nn.Module, engine: str, batch: int, steps: int) -> dict[str, float]:
    """Operator counts and times per token of ``steps`` decode steps of ``engine``."""
    from qkv.decoding import Engine, Request, SamplingParams

    new_tokens = 3 * steps + 3
    prompts = torch.randint(0, model.config.vocab_size, (batch, 32), generator=torch.Generator().manual_seed(0))
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0, ignore_eos=True)
    pool = Engine(model, batch, 32 + new_tokens + 1, step=engine)
    with torch.no_grad():
        pool.add([Request(row.tolist(), params) for row in prompts])  # the prefill
        for _ in range(3):
            pool.step()
        start = time.perf_counter()
        for _ in range(steps):
            pool.step()
        wall = (time.perf_counter() - start) / steps
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                pool.step()
    pool.close()
    events = prof.events()
    top = collections.Counter(
        e.name
        for e in events
        if e.name.startswith("aten::") and not (e.cpu_parent and e.cpu_parent.name.startswith("aten::"))
    )
    every = collections.Counter(e.name for e in events if e.name.startswith("aten::"))
    stats = prof.key_averages()
    matmul = sum(e.self_cpu_time_total for e in stats if e.key in MATMUL)
    rest = sum(e.self_cpu_time_total for e in stats if e.key not in MATMUL)
    return {
        "top_ops": sum(top.values()) / steps,
        "top_views": sum(n for name, n in top.items() if name in VIEWS) / steps,
        "all_ops": sum(every.values()) / steps,
        "all_views": sum(n for name, n in every.items() if name in VIEWS) / steps,
        "cats": every["aten::cat"] / steps,
        "matmul_ms": matmul / steps / 1e3,
        "rest_ms": rest / steps / 1e3,
        "wall_ms": wall * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 2-layer model, batch 1, few steps")
    parser.add_argument("--steps", type=int, default=20, help="decode steps profiled (default 20)")
    args = parser.parse_args(argv)
    import transformers

    from qkv.pretrained import convert_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2) if args.quick else transformers.GPT2Config()
    hf = transformers.GPT2LMHeadModel(config).eval()
    model = convert_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
    del hf
    print(f"GPT-2 {'2-layer' if args.quick else 'small'}, fp32, CPU, {torch.get_num_threads()} threads")
    print("engine  batch | ops/token from Python (views) | all ops (views, cat) | matmul ms | rest ms | wall ms/token")
    for batch in (1,) if args.quick else (1, 8):
        for engine in ("model", "static", "native"):
            r = profile_engine(model, engine, batch, 5 if args.quick else args.steps)
            print(
                f"{engine:>6} {batch:>6} | {r['top_ops']:17.0f} ({r['top_views']:.0f}) | "
                f"{r['all_ops']:8.0f} ({r['all_views']:.0f}, {r['cats']:.0f}) | {r['matmul_ms']:9.1f} | "
                f"{r['rest_ms']:7.1f} | {r['wall_ms']:.1f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
