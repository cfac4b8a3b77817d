"""Language-model training benchmark: Tiny Shakespeare, the well-known CPU configuration.

Character-level, 4 layers, 4 heads, 128 wide, context 64, batch 12, 2000 iterations, no dropout; evaluated
every 250 iterations on 200 batches (the protocol of nanoGPT's shakespeare_char example). Prints tokens/s,
ms per iteration, model FLOPs utilisation (MFU) against a float32 matmul peak measured in this same run,
the final validation loss and the wall time. Targets: validation loss <= 1.70 and MFU >= 55%.

It also prints when the run first reached the reference implementation's 2000-step validation loss
(1.8857, which took the reference 2:18 = 138 s): the step and the wall time, as a ratio to 138 s. That
step is found by cheap probes (20 validation batches every 50 steps; the full 200-batch evaluation once a
probe is within 0.03 of 1.8857), which change nothing in the run and whose time is not counted
(bench/loss_target.py).

    python bench/train_lm.py                       # the full benchmark (about 3.5 minutes)
    python bench/train_lm.py --steps 200 --quick   # a smoke run
    python bench/train_lm.py --compare-compile     # the training step with and without torch.compile
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from loss_target import LossTarget
from settings_flag import add_set_argument, apply_settings

from qkv.training import TrainConfig, train_language_model
from qkv.training.flops import matmul_peak_flops, training_flops_per_token

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare" / "input.txt"
REFERENCE_LOSS, REFERENCE_SECONDS = 1.8857, 138.0  # the reference implementation's 2000 steps (2:18)
MODEL = {"n_layers": 4, "n_heads": 4, "d_model": 128, "context_length": 64, "dropout": 0.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate (default: qkv's default)")
    parser.add_argument("--warmup-steps", type=int, default=None)
    parser.add_argument("--positional", default=None)
    parser.add_argument("--activation", default=None)
    parser.add_argument("--eval-interval", type=int, default=250)
    parser.add_argument("--eval-batches", type=int, default=200)
    add_set_argument(parser, "weight_decay=0 or model.bias=false")
    parser.add_argument("--quick", action="store_true", help="short peak measurement, for smoke runs")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument(
        "--compare-compile",
        action="store_true",
        help="instead of the benchmark: time the training step with and without torch.compile, interleaved",
    )
    parser.add_argument("--repeats", type=int, default=40, help="timed steps of each kind for --compare-compile")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, float]:
    if not Path(args.data).exists():
        sys.exit(f"{args.data} is absent: pass --data /path/to/tinyshakespeare/input.txt")
    peak = matmul_peak_flops(seconds=0.3 if args.quick else 2.0)
    model = dict(MODEL)
    for name in ("positional", "activation"):
        if getattr(args, name) is not None:
            model[name] = getattr(args, name)
    settings = dict(
        data=args.data,
        preset="gpt-micro",
        model=model,
        steps=args.steps,
        batch_size=12,
        eval_interval=args.eval_interval,
        eval_batches=args.eval_batches,
        log_interval=50,
        out_dir=args.out_dir or tempfile.mkdtemp(prefix="qkv-bench-lm-"),
    )
    if args.lr is not None:
        settings["lr"] = args.lr
    if args.warmup_steps is not None:
        settings["warmup_steps"] = args.warmup_steps
    apply_settings(args.set, settings, model)
    config = TrainConfig(**settings)
    wall = time.perf_counter()
    reach = LossTarget(REFERENCE_LOSS, probe_interval=50, probe_batches=20)
    result = train_language_model(config, quiet=True, on_step=reach)
    wall = time.perf_counter() - wall - reach.probe_seconds
    from qkv.model_dir import load_model_dir

    bundle = load_model_dir(result.run_dir)
    tokens_per_s = result.tokens / result.train_seconds
    mfu = training_flops_per_token(bundle.model) * tokens_per_s / peak
    figures = {
        "val_loss": result.last_eval.get("val_loss", float("nan")),
        "tokens_per_s": tokens_per_s,
        "ms_per_iter": 1000 * result.train_seconds / result.step,
        "mfu": mfu,
        "peak_gflops": peak / 1e9,
        "wall_s": wall,
        "reference_step": reach.step,
        "reference_seconds": reach.wall_seconds,
        "compile_s": result.compile_seconds,
    }
    print(f"data                {args.data}")
    print(
        f"model               {bundle.model.num_parameters():,} parameters, {bundle.config.positional} positions, "
        f"{bundle.config.activation}"
    )
    print(
        f"settings            lr {config.lr}, warmup {config.warmup_steps}, schedule {config.schedule}, "
        f"min_lr {config.min_lr}, weight decay {config.weight_decay}, betas ({config.beta1}, {config.beta2})"
    )
    print(f"matmul peak         {peak / 1e9:.1f} GFLOP/s (float32, {torch.get_num_threads()} threads, this run)")
    print(f"training            {tokens_per_s:,.0f} tokens/s, {figures['ms_per_iter']:.1f} ms/iteration")
    print(f"MFU                 {100 * mfu:.1f}%   (target >= 55%)")
    print(f"validation loss     {figures['val_loss']:.4f} at step {result.step}   (target <= 1.70)")
    print(f"reference's loss    {reach.describe(REFERENCE_SECONDS)}")
    if result.compile_seconds:
        print(f"torch.compile       {result.compile_seconds:.1f} s in the first step (included above)")
    print(f"wall time           {wall:.0f} s (including evaluations and data preparation, without the probes)")
    return figures


def training_step(model, trained, kind: str, x: torch.Tensor, y: torch.Tensor):  # noqa: ANN001
    """One training step of ``model`` (``trained`` holds its parameters), as a function of nothing."""
    from qkv.training.optim import make_optimizer
    from qkv.training.tasks.language_model import next_token_loss

    optimizer = make_optimizer(trained, lr=3e-3, weight_decay=0.0, betas=(0.9, 0.99), device_type="cpu", kind=kind)

    def step() -> None:
        loss = next_token_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def compare_compile(args: argparse.Namespace) -> dict[str, float]:
    """ms per training step (forward, loss, backward, clip, optimizer) of the benchmark's model, eager and
    compiled, the steps taken in turn so that the machine's load falls on both alike."""
    from pretrained import interleaved_times

    from qkv.data.lm import TokenBatches
    from qkv.models import GPT, make_config
    from qkv.tokenizers import train_tokenizer

    text = Path(args.data).read_text(encoding="utf-8")
    tokenizer = train_tokenizer("char", text)
    x, y = TokenBatches.from_text(text, tokenizer, MODEL["context_length"], seed=0).train_batch(12)
    figures: dict[str, float] = {}
    for kind in ("muon", "adamw"):
        torch.manual_seed(0)
        eager = GPT(make_config("gpt-micro", vocab_size=tokenizer.vocab_size, **MODEL))
        twin = GPT(make_config("gpt-micro", vocab_size=tokenizer.vocab_size, **MODEL))
        twin.load_state_dict(eager.state_dict())
        eager_step = training_step(eager, eager, kind, x, y)
        compiled_step = training_step(torch.compile(twin), twin, kind, x, y)
        start = time.perf_counter()
        compiled_step()  # compiles the forward and the backward
        compile_seconds = time.perf_counter() - start
        eager_s, compiled_s = interleaved_times((eager_step, compiled_step), args.repeats)
        figures[f"{kind}_ratio"] = eager_s / compiled_s
        print(
            f"{kind:<6} eager {1000 * eager_s:6.1f} ms/step   compiled {1000 * compiled_s:6.1f} ms/step   "
            f"compiled is {eager_s / compiled_s:.2f}x as fast   (compiling took {compile_seconds:.0f} s; "
            f"{torch.get_num_threads()} threads, median of {args.repeats} interleaved steps)"
        )
    return figures


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.compare_compile:
        compare_compile(arguments)
    else:
        run(arguments)
