"""Run by tests/training/test_strategy.py under ``torchrun --nproc_per_node=2`` (gloo, CPU): the same small
GPT trained with DDP and with FSDP (also compiled; a Llama with FSDP), an FSDP run stopped and resumed, Muon's shared
Newton-Schulz, and a DDP run on a folder written by ``qkv prepare`` that records the windows each process
trains on.

    python -m torch.distributed.run --nproc_per_node=2 tests/training/distributed_worker.py OUT_DIR

Everything it produces goes under OUT_DIR (run directories, ``newton_schulz.safetensors`` and
``windows-rank{0,1}.safetensors``) for the test process to compare with single-process runs.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from qkv.training import TrainConfig, train_language_model
from qkv.training.muon import orthogonalize, orthogonalize_shared
from qkv.training.tasks.language_model import LanguageModelTask

TEXT = "the quick brown fox jumps over the lazy dog. " * 200
PREPARED = "prepared"  # the folder under OUT_DIR that the test prepares from RANDOM_TEXT before the launch
RANDOM_TEXT = "".join(random.Random(0).choices("abcdefghij klmnop", k=20_000))  # no window repeats another


@contextmanager
def recorded_windows() -> Iterator[list[torch.Tensor]]:
    """The input windows (B, T) of every training step this process takes, as the trainer draws them."""
    seen: list[torch.Tensor] = []
    original = LanguageModelTask.train_batch

    def train_batch(self, rank: int, world_size: int):  # noqa: ANN001, ANN202
        x, y = original(self, rank, world_size)
        seen.append(x.clone())
        return x, y

    LanguageModelTask.train_batch = train_batch
    try:
        yield seen
    finally:
        LanguageModelTask.train_batch = original


LLAMA = dict(preset="llama-micro", model={"context_length": 16, "dropout": 0.0, "n_layers": 2, "d_model": 64})


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
        device="cpu",  # gloo on the CPU, whatever GPUs the machine has
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


def ddp_on_prepared_shards(out: Path) -> None:
    """Both processes map the same prepared shards; each saves the windows it trained on."""
    with recorded_windows() as seen:
        train_language_model(settings(out, "ddp-prepared", data=str(out / PREPARED)), quiet=True)
    save_file({"windows": torch.stack(seen)}, str(out / f"windows-rank{dist.get_rank()}.safetensors"))


def main(out: Path) -> None:
    dist.init_process_group("gloo")  # one group for every run below (the trainer leaves a group it did not make)
    train_language_model(settings(out, "ddp", strategy="ddp"), quiet=True)
    train_language_model(settings(out, "fsdp", strategy="fsdp"), quiet=True)
    train_language_model(settings(out, "fsdp-adamw", strategy="fsdp", optimizer="adamw"), quiet=True)
    train_language_model(settings(out, "fsdp-llama", strategy="fsdp", **LLAMA), quiet=True)  # GQA, RMSNorm, SwiGLU
    split = settings(out, "fsdp-split", strategy="fsdp", steps=3)
    train_language_model(split, quiet=True)
    train_language_model(split.replace(steps=6), resume=split.out_dir, quiet=True)
    compiled_fsdp(out)
    shared_newton_schulz(out)
    ddp_on_prepared_shards(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
