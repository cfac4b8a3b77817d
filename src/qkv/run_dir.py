"""A run folder: the model folder that ``qkv train`` writes, plus the training checkpoints beside it.

::

    RUN_DIR/
      config.json, tokenizer.json, model.safetensors    the model (qkv.model_dir); the best one so far
      checkpoints/
        latest.json              {"step": 1200, "dir": "step-001200"}: the checkpoint to resume from
        step-001000/             model.safetensors, optimizer.safetensors, trainer_state.json
        step-001200/

This module knows only the layout: the folders' names and which checkpoint is the latest complete one, so
that opening a run that has no best model yet (:func:`qkv.load`) can use its latest checkpoint. Writing and
reading a checkpoint's contents is :mod:`qkv.training.checkpoint`.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from qkv.errors import QkvError
from qkv.io import check_readable, read_json
from qkv.storage import MODEL_FILE

CHECKPOINTS_DIR = "checkpoints"
LATEST_FILE = "latest.json"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"
TRAIN_CONFIG_FILE = "train_config.json"  # the training settings and the data's fingerprint (qkv.training.run)
_STEP_DIR = re.compile(r"step-(\d+)")


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


def step_of(path: Path) -> int | None:
    match = _STEP_DIR.fullmatch(path.name)
    return int(match.group(1)) if match else None


def is_complete(path: Path) -> bool:
    return all((path / name).is_file() for name in (MODEL_FILE, OPTIMIZER_FILE, STATE_FILE))


def step_dirs(root: Path) -> list[Path]:
    """The step-NNNNNN folders under ``root``, oldest step first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p))  # type: ignore[arg-type, return-value]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The step folder to resume from, or None if the run has no complete checkpoint.

    That is the folder latest.json names. If latest.json is missing or damaged, or names a folder that is
    gone or incomplete, the newest complete step folder is used instead, with a warning.
    """
    root = Path(run_dir) / CHECKPOINTS_DIR
    check_readable(root, "the checkpoints")  # a folder this user may not read: one line, not a PermissionError
    latest = root / LATEST_FILE
    problem = f"{latest} is missing"
    if latest.is_file():
        try:
            name = read_json(latest, what="checkpoint pointer")["dir"]
            candidate = root / name
        except (QkvError, KeyError, TypeError):
            problem = f"{latest} is damaged"
        else:
            if isinstance(name, str) and step_of(candidate) is not None and is_complete(candidate):
                return candidate
            problem = f"{latest} points to {name!r}, which is missing or incomplete"
    complete = [p for p in step_dirs(root) if is_complete(p)]
    if not complete:
        return None
    message = f"{problem}; resuming from {complete[-1]}, the newest complete checkpoint"
    if message not in _WARNED:  # a resume asks several times; the user hears it once
        _WARNED.add(message)
        warnings.warn(message, stacklevel=2)
    return complete[-1]


_WARNED: set[str] = set()
