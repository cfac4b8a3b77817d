"""Generation speed on a GPU: qkv's decoding engines against Hugging Face `transformers`' generate, one run.

GPT-2 small (random weights, the same in both), greedy, 32-token prompt + 128 new tokens, batch 1 and 8, fp32
and bf16. For each engine (see qkv.decoding.engine) it prints new tokens per second, the ratio to
transformers measured side by side (the calls taken in turn), the first call's time (CUDA-graph capture or
compilation happen there) and whether the tokens equal transformers' (fp32 must; bf16 rounds differently).

    python bench/generate_gpu.py                    # on CUDA: the whole table, a few minutes on an H100
    python bench/generate_gpu.py --engines graph    # only the default CUDA engine
    python bench/generate_gpu.py --quick            # fewer tokens and repetitions

Targets (issue 13): batch 1 >= 5x transformers and >= 1,000 new tokens/s on an H100, batch 8 >= 3x, in fp32
and bf16; the same tokens in fp32. Without CUDA the script runs a reduced CPU mode end to end (a 2-layer
GPT-2-shaped model, fp32, 16 + 32 tokens, the CPU's engines), which checks the code path and the tokens;
its speeds say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrained import interleaved_times  # noqa: E402  (a sibling script)

CUDA_ENGINES = ("graph", "compiled-graph", "static", "model")
CPU_ENGINES = ("static", "compiled", "model")


def build_models(full: bool, device: torch.device, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """transformers' GPT2LMHeadModel and qkv's GPT with the same random weights, in eval mode."""
    import transformers

    from qkv.pretrained import convert_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config() if full else transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = convert_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
    return hf.to(device=device, dtype=dtype), ours.to(device=device, dtype=dtype)


def timed(fn: Callable[[], torch.Tensor], device: torch.device) -> Callable[[], torch.Tensor]:
    """``fn`` followed by a device synchronisation, so that a timer sees the work done."""

    def run() -> torch.Tensor:
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    return run


def measure(
    batch: int,
    dtype: torch.dtype,
    engines: tuple[str, ...],
    *,
    full: bool,
    device: torch.device,
    prompt_len: int,
    new: int,
    repeats: int,
) -> list[dict[str, object]]:
    """One row per engine (and one for transformers): tokens/s, ratio, first-call seconds, same tokens."""
    from qkv.decoding import generate

    hf, ours = build_models(full, device, dtype)
    vocab = hf.config.vocab_size
    prompt = torch.randint(0, vocab, (batch, prompt_len), generator=torch.Generator().manual_seed(1)).to(device)

    def run_hf() -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )

    runs = {"transformers": timed(run_hf, device)}
    for engine in engines:
        runs[engine] = timed(lambda e=engine: generate(ours, prompt, max_new_tokens=new, temperature=0, step=e), device)
    first, outputs = {}, {}
    for name, fn in runs.items():  # the first call: CUDA-graph capture or compilation happen here
        start = time.perf_counter()
        outputs[name] = fn()
        first[name] = time.perf_counter() - start
    seconds = dict(zip(runs, interleaved_times(tuple(runs.values()), repeats), strict=True))
    rows = []
    for name in runs:
        rows.append(
            {
                "engine": name,
                "tokens_per_s": batch * new / seconds[name],
                "ratio": seconds["transformers"] / seconds[name],
                "first_call_s": first[name],
                "same_tokens": torch.equal(outputs[name].cpu(), outputs["transformers"].cpu()),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer new tokens and repetitions")
    parser.add_argument("--engines", nargs="+", help=f"engines to time (CUDA: {CUDA_ENGINES}; CPU: {CPU_ENGINES})")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8], help="batch sizes (default 1 8)")
    parser.add_argument("--dtypes", nargs="+", choices=("fp32", "bf16"), help="default: fp32 bf16 on CUDA, fp32 on CPU")
    args = parser.parse_args(argv)

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    engines = tuple(args.engines or (CUDA_ENGINES if cuda else CPU_ENGINES))
    dtypes = args.dtypes or (["fp32", "bf16"] if cuda else ["fp32"])
    prompt_len, new = (32, 128) if cuda else (16, 32)
    if args.quick:
        new //= 4
    repeats = 2 if args.quick else 5
    where = torch.cuda.get_device_name() if cuda else "CPU, reduced mode (2-layer GPT-2-shaped model)"
    print(
        f"{where}; torch {torch.__version__}; GPT-2 {'small' if cuda else 'tiny'}, greedy, {prompt_len} + {new} tokens"
    )
    header = f"{'dtype':>5} {'batch':>5} | {'engine':>14} | {'new tok/s':>9} | {'vs HF':>6} | {'first call':>10} | "
    header += "same tokens"
    print(header)
    print("-" * len(header))
    for dtype_name in dtypes:
        dtype = torch.float32 if dtype_name == "fp32" else torch.bfloat16
        for batch in args.batches:
            rows = measure(
                batch, dtype, engines, full=cuda, device=device, prompt_len=prompt_len, new=new, repeats=repeats
            )
            for r in rows:
                print(
                    f"{dtype_name:>5} {batch:>5} | {r['engine']:>14} | {r['tokens_per_s']:9.1f} | "
                    f"{r['ratio']:5.2f}x | {r['first_call_s']:9.2f}s | {'yes' if r['same_tokens'] else 'no'}",
                    flush=True,
                )
    print("targets: batch 1 >= 5x and >= 1,000 tok/s (H100), batch 8 >= 3x; fp32 tokens equal to transformers'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
