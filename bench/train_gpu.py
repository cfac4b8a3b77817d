"""GPU training speed against nanoGPT (issue 12), measured through qkv's own trainer (`train_language_model`).

Two configurations, each trained with AdamW and with Muon (bf16 autocast, TF32, fused AdamW, torch.compile,
SDPA flash attention, no host sync between steps except at logging):

1. ``char``: Tiny Shakespeare, character level, 6 layers x 384 wide, 6 heads, context 256, batch 64,
   dropout 0.2, no biases (nanoGPT's shakespeare_char). Tokens/s over the steady steps, and the step and
   time at which the validation loss (200 batches, as nanoGPT evaluates) first reaches 1.47: probed every
   100 steps on 20 batches (bench/loss_target.py); the run stops there, or after 5000 steps.
2. ``gpt2``: the GPT-2 small shape, 12 layers x 768, 12 heads, context 1024, batch 12, vocabulary 8192 (a
   BPE tokenizer trained on the corpus), no dropout, no biases. Tokens/s, ms/step and model FLOPs
   utilisation (MFU) against a bfloat16 matmul peak measured in this same run, over the steps after
   compilation and warm-up; plus AdamW without torch.compile, for nanoGPT's eager figure.

Printed beside nanoGPT's figures from the issue (H100): char 1.31M tokens/s (12.5 ms/step), GPT-2 shape
552k tokens/s (22.2 ms/step) compiled and 27.1 ms/step eager. Targets on an H100: at least 1.2x nanoGPT's
tokens/s on both with AdamW; Muon's step within 15% of AdamW's.

    python bench/train_gpu.py --data input.txt            # CUDA: everything (about 6 minutes on an H100)
    python bench/train_gpu.py --only gpt2 --optimizers adamw
    python bench/train_gpu.py --cpu-smoke                 # tiny sizes, a few steps, on the CPU

Without CUDA it runs the ``--cpu-smoke`` sizes (so the tests can run it here).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from loss_target import LossTarget
from settings_flag import add_set_argument, apply_settings

from qkv.training import TrainConfig, train_language_model
from qkv.training.flops import matmul_peak_flops, training_flops_per_token

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
NANOGPT = {  # the figures, H100, bf16, torch.compile
    "char": {"tokens_per_s": 1.31e6, "ms_per_step": 12.5, "best_val_loss": 1.4675},
    "gpt2": {"tokens_per_s": 552e3, "ms_per_step": 22.2, "eager_ms_per_step": 27.1},
}
TARGET_LOSS = 1.47
NO_BIAS = {"bias": False}

# name -> (model fields, training settings) for CUDA, and the --cpu-smoke sizes.
CONFIGS: dict[str, dict[str, Any]] = {
    "char": dict(
        model=dict(n_layers=6, n_heads=6, d_model=384, context_length=256, dropout=0.2, **NO_BIAS),
        train=dict(tokenizer="char", batch_size=64, steps=5000, eval_interval=250, eval_batches=200, warmup_steps=100),
        timed_from=200,
    ),
    "gpt2": dict(
        model=dict(n_layers=12, n_heads=12, d_model=768, context_length=1024, dropout=0.0, **NO_BIAS),
        train=dict(
            tokenizer="bpe",
            vocab_size=8192,
            batch_size=12,
            steps=300,
            eval_interval=300,
            eval_batches=5,
            warmup_steps=30,
        ),
        timed_from=100,
    ),
}
SMOKE: dict[str, dict[str, Any]] = {
    "char": dict(
        model=dict(n_layers=2, n_heads=2, d_model=32, context_length=32, dropout=0.1, **NO_BIAS),
        train=dict(tokenizer="char", batch_size=8, steps=60, eval_interval=30, eval_batches=4, warmup_steps=5),
        timed_from=20,
    ),
    "gpt2": dict(
        model=dict(n_layers=2, n_heads=2, d_model=32, context_length=64, dropout=0.0, **NO_BIAS),
        train=dict(
            tokenizer="bpe", vocab_size=300, batch_size=4, steps=30, eval_interval=30, eval_batches=2, warmup_steps=5
        ),
        timed_from=10,
    ),
}
OPTIMIZERS = {  # nanoGPT's shakespeare_char settings for AdamW; Muon takes qkv's own rate for its matrices
    "adamw": dict(optimizer="adamw", lr=1e-3, min_lr=1e-4, beta2=0.99, weight_decay=0.1),
    "muon": dict(optimizer="muon", lr=1e-3, min_lr=1e-4, beta2=0.99, weight_decay=0.1),
}


@dataclass
class StepClock:
    """``on_step`` callback: (step, time in training steps, tokens) at every logging step, where the trainer
    has just waited for the device, so that the differences are device time. Evaluations are not in it."""

    log_interval: int
    then: list[Callable] = field(default_factory=list)  # further callbacks (the loss target)
    marks: list[tuple[int, float, int]] = field(default_factory=list)

    def __call__(self, trainer, step: int, loss: torch.Tensor) -> None:  # noqa: ANN001
        if step % self.log_interval == 0:
            self.marks.append((step, trainer.state.elapsed, trainer.state.tokens))
        for callback in self.then:
            callback(trainer, step, loss)

    def speed(self, timed_from: int) -> tuple[float, float]:
        """tokens/s and ms/step between the first mark at or after ``timed_from`` and the last mark (or
        between the last two marks, for a run too short to reach ``timed_from``)."""
        marks = [m for m in self.marks if m[0] >= timed_from]
        marks = marks if len(marks) >= 2 else self.marks[-2:]
        if len(marks) < 2:
            return float("nan"), float("nan")
        (s0, e0, t0), (s1, e1, t1) = marks[0], marks[-1]
        return (t1 - t0) / (e1 - e0), 1000 * (e1 - e0) / (s1 - s0)


def find_data(given: str | None) -> str | None:
    """--data, else ../shared/data's Tiny Shakespeare; None: the built-in corpus."""
    if given:
        return given
    return str(SHARED) if SHARED.is_file() else None


def run_one(name: str, spec: dict[str, Any], optimizer: str, args: argparse.Namespace, *, compile: str) -> dict:
    model = dict(spec["model"])
    settings: dict[str, Any] = dict(
        data=args.data,
        preset="gpt-micro",
        model=model,
        out_dir=tempfile.mkdtemp(prefix=f"qkv-bench-gpu-{name}-"),
        log_interval=2 if args.cpu_smoke else 50,  # a short smoke run still gets marks to time between
        device=args.device,
        compile=compile,
        **spec["train"],
        **OPTIMIZERS[optimizer],
    )
    if args.steps:
        settings["steps"] = args.steps
    apply_settings(args.set, settings, model)
    config = TrainConfig(**settings)
    clock = StepClock(config.log_interval)
    reach = None
    if name == "char":
        target = TARGET_LOSS if not args.cpu_smoke else 3.0
        reach = LossTarget(target, probe_interval=10 if args.cpu_smoke else 100, probe_batches=20, stop=True)
        clock.then.append(reach)
    result = train_language_model(config, quiet=True, on_step=clock)
    tokens_per_s, ms_per_step = clock.speed(spec["timed_from"])
    from qkv.model_dir import load_model_dir

    flops_per_token = training_flops_per_token(load_model_dir(result.run_dir).model)
    return dict(
        config=name,
        optimizer=optimizer,
        compiled=result.compile_seconds > 0,
        tokens_per_s=tokens_per_s,
        ms_per_step=ms_per_step,
        flops_per_token=flops_per_token,
        compile_s=result.compile_seconds,
        steps=result.step,
        val_loss=result.last_eval.get("val_loss", float("nan")),
        reach=reach,
    )


def report(rows: list[dict], peak: float, peak_dtype: str, device: str) -> None:
    print(f"device              {device}; {peak_dtype} matmul peak {peak / 1e12:.2f} TFLOP/s (measured in this run)")
    by_key = {(r["config"], r["optimizer"], r["compiled"]): r for r in rows}
    for row in rows:
        ref = NANOGPT[row["config"]]
        eager = "" if row["compiled"] else ", eager"
        line = (
            f"{row['config']:<5} {row['optimizer']:<6}{eager:<8} {row['tokens_per_s']:>11,.0f} tokens/s  "
            f"{row['ms_per_step']:7.2f} ms/step  MFU {100 * row['flops_per_token'] * row['tokens_per_s'] / peak:5.1f}%"
        )
        if row["compiled"] or "eager_ms_per_step" not in ref:
            line += f"  = {row['tokens_per_s'] / ref['tokens_per_s']:.2f}x nanoGPT compiled (target >= 1.2 with AdamW)"
            line += f"; compiling {row['compile_s']:.0f} s" if row["compiled"] else ""
        else:
            line += f"  = {ref['eager_ms_per_step'] / row['ms_per_step']:.2f}x nanoGPT eager"
        print(line)
        if row["reach"] is not None:
            print(f"      {row['optimizer']:<6} validation loss {row['reach'].describe()}; {row['steps']} steps run")
        adamw = by_key.get((row["config"], "adamw", row["compiled"]))
        if row["optimizer"] == "muon" and adamw:
            slower = row["ms_per_step"] / adamw["ms_per_step"] - 1
            print(f"      muon's step is {100 * slower:+.1f}% against adamw's (target within +15%)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None, help="Tiny Shakespeare's input.txt (default: ../shared/data)")
    parser.add_argument("--only", choices=sorted(CONFIGS), action="append", help="run only this configuration")
    parser.add_argument("--optimizers", nargs="+", choices=sorted(OPTIMIZERS), default=["adamw", "muon"])
    parser.add_argument("--steps", type=int, default=None, help="override the configurations' step counts")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes and a few steps on the CPU")
    parser.add_argument("--no-eager", action="store_true", help="skip the GPT-2-shape AdamW run without compile")
    add_set_argument(parser, 'muon_lr=0.03 or model.activation="relu2"')
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("no CUDA device: running the --cpu-smoke sizes on the CPU", file=sys.stderr)
        args.cpu_smoke = True
    args.device = "cpu" if args.cpu_smoke else "cuda"
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    args.data = find_data(args.data)
    if args.data is None:
        print("Tiny Shakespeare not found (give --data): using the built-in corpus; 1.47 means little there")
    specs = SMOKE if args.cpu_smoke else CONFIGS
    if args.cpu_smoke:  # bfloat16 matmuls are slow on most CPUs; the smoke run trains in float32
        peak, peak_dtype = matmul_peak_flops(size=256, seconds=0.1), "float32"
    else:
        peak, peak_dtype = matmul_peak_flops(size=8192, seconds=2.0, dtype=torch.bfloat16, device="cuda"), "bf16"
    rows = []
    started = time.perf_counter()
    for name in args.only or list(specs):
        for optimizer in args.optimizers:
            rows.append(run_one(name, specs[name], optimizer, args, compile="auto"))
        if name == "gpt2" and "adamw" in args.optimizers and not args.no_eager:
            rows.append(run_one(name, specs[name], "adamw", args, compile="off"))
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (smoke sizes: no figure means anything)"
    report(rows, peak, peak_dtype, device)
    print(f"bench time          {time.perf_counter() - started:.0f} s")
    return rows


if __name__ == "__main__":
    main()
