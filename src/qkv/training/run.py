"""A training run on disk and the machine it runs on: the run directory, its saved settings, the device,
the precision, the process group and the random seed. Shared by every task so that language models and
translators are trained, checkpointed and resumed the same way.

A run directory holds:

    config.json            the model's architecture (qkv.models.config)
    tokenizer.json         the tokenizer (tokenizer_target.json too for a translator with two vocabularies)
    model.safetensors      the best weights so far (by the validation metric)
    train_config.json      the training settings and a fingerprint of the data
    checkpoints/           resumable checkpoints (weights, optimizer, data order, random state)
    metrics.jsonl/.csv     the metrics log;  loss.png  the loss curve
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from qkv.errors import QkvError
from qkv.io import atomic_write_json, read_json
from qkv.model_dir import QUANTIZATION_FILE
from qkv.run_dir import TRAIN_CONFIG_FILE
from qkv.training.allocator import keep_freed_memory
from qkv.training.config import TrainConfig
from qkv.training.device import Precision, resolve_device, resolve_precision, set_threads
from qkv.training.distributed import DistInfo, init_distributed

RUN_CONFIG_FILE = TRAIN_CONFIG_FILE


def fingerprint(text: str) -> str:
    """sha256 of the training text, to notice when a resumed run would read different data."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_run_dir(out_dir: str | None, task: str) -> Path:
    """The directory for a new run (default ``runs/<task>-<date>-<time>``); refuses to reuse an old run."""
    path = Path(out_dir) if out_dir else Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    if (path / RUN_CONFIG_FILE).exists() or (path / "checkpoints").exists():
        raise QkvError(
            f"{path} already holds a training run: continue it with `qkv train --resume {path}`, "
            "or choose another --out"
        )
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_run_config(run_dir: Path, config: TrainConfig, data_info: dict[str, Any]) -> None:
    from qkv.version import __version__

    atomic_write_json(run_dir / RUN_CONFIG_FILE, {"train": config.to_dict(), "data": data_info, "qkv": __version__})


def load_run_config(run_dir: str | Path) -> tuple[TrainConfig, dict[str, Any]]:
    """The training settings and data fingerprint a run was started with."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise QkvError(f"run directory {run_dir} does not exist: give the --out of an earlier `qkv train`")
    if (run_dir / QUANTIZATION_FILE).is_file():
        raise QkvError(
            f"{run_dir} holds int8 weights written by `qkv quantize`, which cannot be trained: resume the run "
            "it was quantized from, and quantize again afterwards"
        )
    path = run_dir / RUN_CONFIG_FILE
    if not path.exists():
        raise QkvError(f"{run_dir} is not a training run (no {RUN_CONFIG_FILE}): give the folder `qkv train` wrote")
    data = read_json(path, what="training settings")
    try:
        return TrainConfig.from_dict(data["train"]), data.get("data", {})
    except (KeyError, TypeError):
        raise QkvError(f"{path} is damaged (no 'train' settings): restore it from a backup") from None


def check_same_data(current: dict[str, Any], saved: dict[str, Any], run_dir: Path) -> None:
    """Refuse to resume on data whose fingerprint differs from the one the run started with."""
    if saved.get("sha256") and saved["sha256"] != current.get("sha256"):
        raise QkvError(
            f"the training data changed since {run_dir} was started (different sha256): resume with the "
            "original data, or start a new run"
        )


@dataclass
class Session:
    """The device, precision and process group a run uses."""

    device: torch.device
    precision: Precision
    dist: DistInfo


def start_session(config: TrainConfig) -> Session:
    """Pick the device and precision, join the process group (under torchrun), set threads and seeds."""
    set_threads(config.threads)
    # Every process of this machine checks that there is a GPU for each (torchrun's LOCAL_WORLD_SIZE) before any
    # joins the group, so that all of them stop with the same line instead of one failing while the others wait.
    preliminary = resolve_device(config.device, local_rank=int(os.environ.get("LOCAL_WORLD_SIZE", "1")) - 1)
    dist = init_distributed(preliminary.type)
    device = resolve_device(config.device, local_rank=dist.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif dist.enabled and not config.threads:  # N processes share the cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.world_size))
    if device.type == "cpu":
        keep_freed_memory()  # a step reuses the pages the last one freed instead of faulting new ones in
    seed_everything(config.seed)
    return Session(device, resolve_precision(config.precision, device), dist)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
