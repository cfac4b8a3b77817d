"""Per-layer times of float32, int8 and int4 linear layers on SmolLM2-135M's matrix shapes, at 1, 8 and 512 rows.

A decoding step multiplies one or a few vectors by every matrix of the model in turn, so each product streams
its matrix from memory (SmolLM2's float32 matrices take 540 MB, far beyond the caches). To time the products
the way a step meets them, each design holds ``--layers`` copies of every shape (30: SmolLM2's blocks) and a
sweep calls them in model order (per block: fused W_q W_k W_v, W_o, fused W_g W_1, W_2; then the tied
unembedding once); the time of each shape is the fastest over sweeps of its calls' sum, divided by the layers
(the fastest, not the median: on a shared machine the other jobs only ever add time).

Designs (one process, interleaved sweeps):

- ``float32``: qkv's :func:`~qkv.layers.linear.linear` (memory-parallel blocks for 1 row, oneDNN's packed
  matrix for 2-256 rows, as decoding calls it inside ``onednn_rows()``);
- ``int8 before``: the weight-only int8 product as qkv ran it before this bench (bfloat16 copy of x, kernel,
  widen, scale: four ops around torch's ``_weight_int8pack_mm``);
- ``int8``: :class:`~qkv.quantization.int8_linear.Int8Linear` now (the scales applied in the op that widens);
- ``int8 kernel``: ``_weight_int8pack_mm`` alone on a ready bfloat16 x (the floor of any int8 weight-only wrapper);
- ``w8a8``: Int8Linear with int8 activations (fbgemm, :mod:`qkv.quantization.dynamic`);
- ``int4``: :class:`~qkv.quantization.int4_linear.Int4Linear`, groups of ``--group-size`` (the kernel up to
  ``KERNEL_ROWS`` rows, bfloat16 dequantize + GEMM beyond);
- ``int4 kernel``: ``_weight_int4pack_mm_for_cpu`` at every row count; ``int4 dequant``: the bfloat16
  dequantize + GEMM path at every row count.

GB/s (up to 16 rows) is the bytes of the weights each design reads (float32: 4 per weight; int8: 1 plus a
scale per row; int4: 1/2 plus bfloat16 scale and zero per group) over its time; GFLOP/s (more rows) is
2 rows N K over it. The figures are indicative: the machine
running a bench is often shared, and only a quiet one gives figures to quote.

    python bench/int4_linear.py                   # all shapes, rows 1, 8, 512 (several minutes on 2 cores)
    python bench/int4_linear.py --quick           # 4 layers, rows 1 and 8, few sweeps
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from qkv.layers.linear import linear, onednn_rows
from qkv.quantization import int4_linear as int4
from qkv.quantization import int8_linear as int8
from qkv.quantization.int4_linear import Int4Linear
from qkv.quantization.int8_linear import Int8Linear

D_MODEL, D_FF, KV_WIDTH, VOCAB = 576, 1536, 192, 49152  # SmolLM2-135M: 9 heads of 64, 3 key/value heads
SHAPES = {  # name: (out, in), in the order a block multiplies them
    "W_qkv": (D_MODEL + 2 * KV_WIDTH, D_MODEL),
    "W_o": (D_MODEL, D_MODEL),
    "W_g,W_1": (2 * D_FF, D_MODEL),
    "W_2": (D_MODEL, D_FF),
}
UNEMBEDDING = ("W_U", (VOCAB, D_MODEL))


def int8_before(layer: Int8Linear) -> Callable:
    """The weight-only int8 product as qkv.quantization.int8_linear ran it before (kept here to compare)."""
    q, scale, ones = layer.qweight, layer.weight_scale, layer.ones

    def product(x: torch.Tensor) -> torch.Tensor:
        if not int8.kernel_applies(x, q):
            return int8._dequantized_product(x, q, scale, None)
        a = x.reshape(-1, q.shape[1]).to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True)
        y = torch.ops.aten._weight_int8pack_mm(a, q, ones).to(x.dtype)
        return y * scale.to(x.dtype)

    return product


def designs_for(weight: torch.Tensor, group_size: int) -> dict[str, tuple[Callable, float]]:
    """Every design's product for one matrix, with the bytes of weights it reads."""
    n_out, n_in = weight.shape
    int8_layer = Int8Linear.from_float(weight, None)
    w8a8 = Int8Linear.from_float(weight, None)
    w8a8.activations = "int8"
    int4_layer = Int4Linear.from_float(weight, None, group_size)
    packed, sz = int4_layer.packed()
    tensors = (int4_layer.qweight, int4_layer.weight_scale, int4_layer.weight_min)
    int8_bytes, int4_bytes = n_out * (n_in + 4), n_out * (n_in // 2 + 4 * n_in // group_size)
    kernel8 = torch.ops.aten._weight_int8pack_mm
    return {
        "float32": (lambda x: linear(x, weight), 4 * weight.numel()),
        "int8 before": (int8_before(int8_layer), int8_bytes),
        "int8": (int8_layer, int8_bytes),
        "int8 kernel": (lambda x: kernel8(x, int8_layer.qweight, int8_layer.ones), int8_bytes),
        "w8a8": (w8a8, int8_bytes),
        "int4": (int4_layer, int4_bytes),
        "int4 kernel": (lambda x: int4.kernel_product(x, packed, sz, n_out, group_size, None), int4_bytes),
        "int4 dequant": (lambda x: int4.reference_product(x, *tensors, None, torch.bfloat16), int4_bytes),
    }


def build(layers: int, group_size: int) -> dict[str, list[tuple[str, dict]]]:
    """For each design, the model-ordered list of (shape name, product) pairs a sweep calls."""
    torch.manual_seed(0)
    order: list[tuple[str, dict]] = []
    for _ in range(layers):
        for name, shape in SHAPES.items():
            order.append((name, designs_for(torch.randn(shape) * 0.02, group_size)))
    order.append((UNEMBEDDING[0], designs_for(torch.randn(UNEMBEDDING[1]) * 0.02, group_size)))
    return {design: [(name, d[design]) for name, d in order] for design in order[0][1]}


def sweep(calls: list, x: dict[int, torch.Tensor]) -> dict[str, float]:
    """One pass over the model's matrices (x by input width): seconds spent per shape name."""
    spent: dict[str, float] = {}
    for name, (product, _) in calls:
        inputs = x[D_FF if name == "W_2" else D_MODEL]
        start = time.perf_counter()
        product(inputs)
        spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=30, help="copies of each block's matrices (SmolLM2: 30)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 512])
    parser.add_argument("--sweeps", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--quick", action="store_true", help="4 layers, rows 1 and 8, 3 sweeps")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.rows, args.sweeps = 4, [1, 8], 3
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.layers} layers, groups of "
          f"{args.group_size}; figures indicative unless the machine was quiet")  # fmt: skip
    plan = build(args.layers, args.group_size)
    counts = {name: args.layers for name in SHAPES} | {UNEMBEDDING[0]: 1}
    sizes = {name: shape for name, shape in [*SHAPES.items(), UNEMBEDDING]}
    for rows in args.rows:
        x = {width: torch.randn(rows, width) for width in (D_MODEL, D_FF)}
        kernel_x = {width: t.to(torch.bfloat16) for width, t in x.items()}
        times: dict[str, dict[str, list[float]]] = {design: {} for design in plan}
        with torch.no_grad(), onednn_rows():
            for design, calls in plan.items():  # warm-up: packed copies, first-touch pages
                sweep(calls, kernel_x if design == "int8 kernel" else x)
            for _ in range(args.sweeps):
                for design, calls in plan.items():
                    for name, seconds in sweep(calls, kernel_x if design == "int8 kernel" else x).items():
                        times[design].setdefault(name, []).append(seconds / counts[name])
        unit = "effective GB/s of weights read" if rows <= 16 else "GFLOP/s"
        print(f"\n{rows} row(s): microseconds per product ({unit})")
        print(f"{'design':>13} " + " ".join(f"{name + str(sizes[name]):>24}" for name in sizes))
        for design, calls in plan.items():
            bytes_of = {name: nbytes for name, (_, nbytes) in calls}
            cells = []
            for name in sizes:
                seconds = min(times[design][name])
                n_out, n_in = sizes[name]
                rate = bytes_of[name] if rows <= 16 else 2 * rows * n_out * n_in
                cells.append(f"{seconds * 1e6:>12.1f} ({rate / seconds / 1e9:>6.1f})")
            print(f"{design:>13} " + " ".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main()
