"""Designs for int8 products of many input vectors (a prompt, a batch of 8 decoding, an encoder's sentences).

Int8Linear multiplies up to ``KERNEL_ROWS`` vectors with torch's int8 kernel; beyond that it widens its int8
matrix Q to the activations' dtype and calls BLAS. This bench times, for GPT-2 small's matrix shapes and
for MiniLM's, at several row counts, interleaved in one run (milliseconds per product, median):

- ``fp32``: ``F.linear`` on a float32 matrix (what the layer replaces; the bound for any widening design);
- ``widen``: widen Q to float32 on every call (a fresh tensor), ``F.linear``, then scale and bias;
- ``dequant``: widen and scale Q in one operation (s Q, a fresh float32 tensor), then ``F.linear`` with the
  bias: two operations instead of three;
- ``workspace``: widen Q into one reused float32 buffer (no allocation, no page faults), then the same;
- ``cached``: keep a float32 copy of s Q beside Q (5x the int8 bytes: fast, but the memory win is gone);
- ``kernel``: torch's int8 kernel for every row count (bfloat16 activations).

It also prints the weights' resident bytes of each design.

    python bench/int8_linear.py            # about 2 minutes
    python bench/int8_linear.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from qkv.quantization.int8_linear import quantize_per_channel

SHAPES = {  # (in, out) of each matrix; one of each per layer
    "gpt2 qkv": (768, 2304),
    "gpt2 W_o": (768, 768),
    "gpt2 W_1": (768, 3072),
    "gpt2 W_2": (3072, 768),
    "minilm W_1": (384, 1536),
    "minilm W_2": (1536, 384),
}


def designs(weight: torch.Tensor, bias: torch.Tensor) -> dict:
    q, scale = quantize_per_channel(weight)
    cached = q.float() * scale[:, None]
    workspace = torch.empty(q.numel())
    ones = torch.ones(q.shape[0], dtype=torch.bfloat16)

    def widen(x):
        return torch.addcmul(bias, F.linear(x, q.to(x.dtype)), scale)

    def dequant(x):
        return F.linear(x, torch.mul(q, scale[:, None]), bias)

    def reuse(x):
        w = workspace.view(q.shape)
        w.copy_(q)
        return torch.addcmul(bias, F.linear(x, w), scale)

    def kernel(x):
        a = x.reshape(-1, q.shape[1]).to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True)
        return torch.addcmul(bias, torch.ops.aten._weight_int8pack_mm(a, q, ones).float(), scale)

    return {
        "fp32": lambda x: F.linear(x, weight, bias),
        "widen": widen,
        "dequant": dequant,
        "workspace": reuse,
        "cached": lambda x: F.linear(x, cached, bias),
        "kernel": kernel,
    }


def median_ms(fns: dict, x: torch.Tensor, repeats: int) -> dict[str, float]:
    for fn in fns.values():
        fn(x)
    spent: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn(x)
            spent[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(times) for name, times in spent.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer row counts and repetitions")
    parser.add_argument("--rows", nargs="+", type=int, default=None, help="input vectors per product")
    args = parser.parse_args(argv)
    rows_list = args.rows or ([16, 256] if args.quick else [16, 32, 64, 256, 1024])
    repeats = 5 if args.quick else 21
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per product, median of {repeats}")
    totals: dict[int, dict[str, float]] = {}
    with torch.no_grad():
        for label, (n_in, n_out) in SHAPES.items():
            weight, bias = torch.randn(n_out, n_in) * 0.02, torch.randn(n_out) * 0.02
            fns = designs(weight, bias)
            for rows in rows_list:
                ms = median_ms(fns, torch.randn(rows, n_in), repeats)
                total = totals.setdefault(rows, dict.fromkeys(ms, 0.0))
                for name, value in ms.items():
                    total[name] += value
                cells = "  ".join(f"{name} {value:7.2f}" for name, value in ms.items())
                print(f"{label:11s} {n_in:5d}->{n_out:5d} rows {rows:5d}: {cells}", flush=True)
    print("sum over the shapes, as a ratio to fp32 (lower is better):")
    for rows, total in totals.items():
        print(f"  rows {rows:5d}: " + "  ".join(f"{k} {v / total['fp32']:.2f}" for k, v in total.items()))
    print(
        "resident weight bytes per float32 weight byte: widen 0.25 (+1.0 transient), workspace 0.25 "
        "(+ one shared buffer), cached 1.25, kernel 0.25"
    )


if __name__ == "__main__":
    main()
