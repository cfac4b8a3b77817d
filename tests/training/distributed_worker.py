"""Run by tests/training/test_strategy.py under ``torchrun --nproc_per_node=2`` (gloo, CPU): the same small
GPT trained with DDP and with FSDP (also compiled), an FSDP run stopped and resumed, and Muon's shared
Newton-Schulz.

    python -m torch.distributed.run --nproc_per_node=2 tests/training/distributed_worker.py OUT_DIR

Everything it produces goes under OUT_DIR (run directories, and ``newton_schulz.safetensors``) for the test
process to compare with single-process runs.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from qkv.training import TrainConfig, train_language_model
from qkv.training.muon import orthogonalize, orthogonalize_shared

TEXT = "the quick brown fox jumps over the lazy dog. " * 200


def settings(out: Path, name: str, **changes) -> TrainConfig:
    """The runs' settings; one process with ``batch_size=4`` sees the same global batch as two with 2."""
    base = dict(
        data=str(out / "text.txt"),
        out_dir=str(out / name),
        preset="gpt-nano",
        model={"context_length": 16, "dropout": 0.0},
        steps=6,
        batch_size=2,
        warmup_steps=1,
        schedule="constant",
        eval_interval=3,
        eval_batches=1,
        log_interval=1,
        threads=1,
    )
    return TrainConfig(**{**base, **changes})


def shared_newton_schulz(out: Path) -> None:
    """5 matrices (not a multiple of 2 processes) orthogonalised by both processes together and by each alone."""
    stack = torch.randn(5, 24, 16, generator=torch.Generator().manual_seed(7))
    shared, alone = orthogonalize_shared(stack), orthogonalize(stack)
    if dist.get_rank() == 0:
        save_file({"shared": shared.contiguous(), "alone": alone.contiguous()}, str(out / "newton_schulz.safetensors"))


def compiled_fsdp(out: Path) -> None:
    """FSDP and torch.compile together, with the aot_eager backend (Dynamo and AOTAutograd as the default
    backend runs them, without generating kernels: that takes minutes on a small CPU)."""
    original = torch.compile
    torch.compile = functools.partial(original, backend="aot_eager")
    try:
        train_language_model(settings(out, "fsdp-compiled", strategy="fsdp", compile="on"), quiet=True)
    finally:
        torch.compile = original


def main(out: Path) -> None:
    dist.init_process_group("gloo")  # one group for every run below (the trainer leaves a group it did not make)
    train_language_model(settings(out, "ddp", strategy="ddp"), quiet=True)
    train_language_model(settings(out, "fsdp", strategy="fsdp"), quiet=True)
    train_language_model(settings(out, "fsdp-adamw", strategy="fsdp", optimizer="adamw"), quiet=True)
    split = settings(out, "fsdp-split", strategy="fsdp", steps=3)
    train_language_model(split, quiet=True)
    train_language_model(split.replace(steps=6), resume=split.out_dir, quiet=True)
    compiled_fsdp(out)
    shared_newton_schulz(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
