"""Resumable training checkpoints: stop a run at any step and continue it bit for bit.

To continue training exactly, a run needs more than the weights: the optimizer's running averages
(AdamW's first and second moments), the learning-rate schedule's position, the loss-scaler state for
mixed precision, and the state of every random-number generator (dropout masks, batch sampling). A run
folder keeps them like this::

    RUN_DIR/checkpoints/
      latest.json                {"step": 1200, "dir": "step-001200"}: the checkpoint to resume from
      step-001000/               the previous one (the newest ``keep`` folders are kept, default 2)
      step-001200/
        model.safetensors        the weights, as :func:`qkv.model_dir.save_weights` writes them
        optimizer.safetensors    every other tensor: optimizer state ("optimizer.state.3.exp_avg") and the
                                 random-number generator states ("rng.torch", "rng.generators.batches")
        trainer_state.json       everything that is not a tensor, readable: the step, the trainer's own
                                 state (schedule, best loss, ...), the optimizer's param_groups (lr, betas),
                                 the grad scaler; tensors appear as {"__tensor__": "<key in optimizer.safetensors>"}

No pickle anywhere: tensors live in safetensors files, everything else in JSON (a tuple such as AdamW's
``betas`` is written {"__tuple__": [0.9, 0.95]} so it comes back as a tuple).

A save is crash-safe. The three files are written into a hidden temporary folder, which is renamed to
``step-NNNNNN`` once complete; only then is ``latest.json`` replaced (atomically), and only after that are
older folders deleted. A crash at any moment leaves the previous checkpoint as the latest one, whole.
"""

from __future__ import annotations

import json
import numbers
import os
import random
import re
import shutil
import sys
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.io import atomic_write_json, atomic_write_text, read_json, remove_killed_writes_in
from qkv.model_dir import load_weights, save_weights
from qkv.run_dir import (
    CHECKPOINTS_DIR,
    LATEST_FILE,
    OPTIMIZER_FILE,
    STATE_FILE,
    latest_checkpoint,
    step_dir_name,
    step_dirs,
    step_of,
)
from qkv.storage import MODEL_FILE, read_tensors, save_tensors

__all__ = [  # the checkpoint layout (qkv.run_dir) is importable from here too, as it always was
    "CHECKPOINTS_DIR",
    "LATEST_FILE",
    "OPTIMIZER_FILE",
    "STATE_FILE",
    "clean_leftovers",
    "latest_checkpoint",
    "load_training_checkpoint",
    "save_training_checkpoint",
    "step_dir_name",
    "step_of",
]

FORMAT = "qkv-training-checkpoint"
FORMAT_VERSION = 1


# ------------------------------------------------------------------------ tensors and JSON, without pickle


def _encode(value: Any, key: str, tensors: dict[str, Tensor]) -> Any:
    """JSON-ready copy of ``value``: tensors move to ``tensors[key]`` (a reference stays), tuples are tagged."""
    if isinstance(value, Tensor):
        tensors[key] = value
        return {"__tensor__": key}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _encode(v, f"{key}.{k}", tensors) for k, v in value.items()}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Real):  # includes numpy scalars
        return int(value) if isinstance(value, numbers.Integral) else float(value)
    raise TypeError(f"cannot save {type(value).__name__} at {key} without pickle: use tensors, numbers or strings")


def _decode(value: Any, tensors: dict[str, Tensor], where: Path) -> Any:
    """Undo :func:`_encode`, taking the referenced tensors from ``tensors``."""
    if isinstance(value, list):
        return [_decode(v, tensors, where) for v in value]
    if not isinstance(value, dict):
        return value
    if set(value) == {"__tensor__"}:
        key = value["__tensor__"]
        if key not in tensors:
            raise QkvError(
                f"{OPTIMIZER_FILE} in {where} lacks tensor {key} that {STATE_FILE} refers to: the two files come "
                f"from different saves; delete {where} to resume from the checkpoint before it"
            )
        return tensors[key]
    if set(value) == {"__tuple__"}:
        return tuple(_decode(v, tensors, where) for v in value["__tuple__"])
    return {k: _decode(v, tensors, where) for k, v in value.items()}


# ----------------------------------------------------------------------------- random-number generators


def _capture_rng(generators: dict[str, torch.Generator]) -> dict[str, Any]:
    """The state of Python's, torch's (CPU and every CUDA device), numpy's and each named generator."""
    version, internal, gauss_next = random.getstate()
    rng: dict[str, Any] = {
        "python": {"version": version, "gauss_next": gauss_next, "state": torch.tensor(internal, dtype=torch.int64)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "generators": {name: generator.get_state() for name, generator in generators.items()},
    }
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        name, keys, pos, has_gauss, cached = numpy.random.get_state()
        rng["numpy"] = {
            "name": name,
            "state": torch.from_numpy(keys.astype("int64")),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    return rng


def _restore_rng(rng: dict[str, Any], generators: dict[str, torch.Generator], where: Path) -> None:
    python = rng["python"]
    state = tuple(int(x) for x in python["state"].tolist())
    random.setstate((python["version"], state, python["gauss_next"]))
    torch.set_rng_state(rng["torch"].cpu())
    cuda = rng.get("cuda") or []
    if cuda and torch.cuda.is_available():
        if len(cuda) != torch.cuda.device_count():
            warnings.warn(
                f"{where} was saved with {len(cuda)} GPU(s), resuming with {torch.cuda.device_count()}: "
                "the run continues, but not bit for bit",
                stacklevel=3,
            )
        for index, device_state in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state.cpu(), index)
    elif cuda:
        warnings.warn(f"{where} was saved on a GPU: its CUDA random state is not restored here", stacklevel=3)
    numpy_state = rng.get("numpy")
    if numpy_state is not None:
        import numpy

        keys = numpy_state["state"].cpu().numpy().astype(numpy.uint32)
        numpy.random.set_state(
            (numpy_state["name"], keys, numpy_state["pos"], numpy_state["has_gauss"], numpy_state["cached_gaussian"])
        )
    saved = rng.get("generators", {})
    for name, generator in generators.items():
        if name in saved:
            generator.set_state(saved[name].cpu())
        else:
            warnings.warn(f"{where} has no state for generator {name!r}: it keeps its current state", stacklevel=3)


# ------------------------------------------------------------------------------------------ save / load


def all_finite(model: nn.Module) -> bool:
    """Whether every parameter of ``model`` is finite (one host sync): a checkpoint is saved only then."""
    flags = [torch.isfinite(p).all() for p in model.parameters()]
    return bool(torch.stack(flags).all()) if flags else True


def save_training_checkpoint(
    run_dir: str | Path,
    *,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    generators: dict[str, torch.Generator] | None = None,
    scaler: Any = None,
    keep: int | None = 2,
    model_state: dict[str, Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Save everything needed to resume at ``step`` under RUN_DIR/checkpoints; return the step folder.

    ``trainer_state`` is the trainer's own dict of JSON data and tensors (tensors go to the safetensors file);
    ``generators`` are named torch.Generators (e.g. the batch sampler's); ``scaler`` is a torch.amp.GradScaler
    or None. The newest ``keep`` step folders are kept (None keeps all). ``model_state`` and ``optimizer_state``
    replace the model's and the optimizer's own state dicts (the whole tensors gathered from a sharded model:
    the file is the same).
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise QkvError(f"step={step!r} must be a whole number >= 0")
    if keep is not None and keep < 1:
        raise QkvError(f"keep={keep} must be at least 1 (or None to keep every checkpoint)")
    text, tensors = _checkpoint_document(step, trainer_state, optimizer, optimizer_state, scaler, generators)
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    previous = _write_step_dir(root, name, model, model_state, tensors, text)
    atomic_write_json(root / LATEST_FILE, {"step": step, "dir": name})  # from here on, resume uses the new folder
    if previous is not None:
        shutil.rmtree(previous, ignore_errors=True)
    _prune(root, step, keep)
    return root / name


def _checkpoint_document(
    step: int,
    trainer_state: dict[str, Any],
    optimizer: torch.optim.Optimizer | None,
    optimizer_state: dict[str, Any] | None,
    scaler: Any,
    generators: dict[str, torch.Generator] | None,
) -> tuple[str, dict[str, Tensor]]:
    """The state file's JSON text and the tensors it refers to (the optimizer file): the trainer's state, the
    optimizer's (its own state dict, or ``optimizer_state``), the scaler's and every random generator's."""
    tensors: dict[str, Tensor] = {}
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "step": step,
        "trainer_state": _encode(trainer_state, "trainer", tensors),
        "optimizer": None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "rng": _encode(_capture_rng(generators or {}), "rng", tensors),
    }
    if optimizer is not None:
        encoded = _encode(optimizer.state_dict() if optimizer_state is None else optimizer_state, "optimizer", tensors)
        document["optimizer"] = {"class": type(optimizer).__name__, **encoded}
    try:
        text = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    except (TypeError, ValueError) as error:
        raise TypeError(f"trainer_state must hold only JSON data (numbers, strings, lists, dicts): {error}") from None
    return text, tensors


def _write_step_dir(
    root: Path,
    name: str,
    model: nn.Module,
    model_state: dict[str, Tensor] | None,
    tensors: dict[str, Tensor],
    text: str,
) -> Path | None:
    """Write the step folder ``root/name`` whole or not at all: into a temporary folder, renamed when complete
    (the state file last: its presence marks a complete folder). A folder of the same step is moved aside and
    returned, for the caller to delete once the new one is recorded as the latest; on failure it is put back."""
    final, previous = root / name, None
    temporary = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    os.chmod(temporary, 0o755)
    try:
        save_weights(model, temporary / MODEL_FILE, state=model_state)
        save_tensors(temporary / OPTIMIZER_FILE, tensors, {"format": FORMAT})
        atomic_write_text(temporary / STATE_FILE, text)  # last: its presence marks a complete folder
        if final.exists():  # saving the same step again: move the old folder aside, then swap
            previous = root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, previous)
        os.replace(temporary, final)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        if previous is not None and not final.exists():
            os.replace(previous, final)
        raise
    return previous


def clean_leftovers(run_dir: str | Path) -> list[Path]:
    """Delete what a killed process left half-written: ``.NAME.*.tmp`` files of atomic writes (in the run
    directory and checkpoints/) and ``.tmp-step-*`` folders of unfinished checkpoints. Returns what was deleted.
    Finished files are never among them: an atomic write renames its temporary file only when complete, and one
    still running holds a lock on it (:func:`qkv.io.remove_killed_writes_in`)."""
    run_dir = Path(run_dir)
    removed = []
    for folder in (run_dir, run_dir / CHECKPOINTS_DIR):
        if not folder.is_dir():
            continue
        removed += remove_killed_writes_in(folder)
        for path in folder.iterdir():
            if path.is_dir() and re.fullmatch(r"\.tmp-step-\d+-.*", path.name):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _prune(root: Path, step: int, keep: int | None) -> None:
    """Delete leftovers of interrupted saves and all but the newest ``keep`` folders up to ``step``.

    Folders for later steps (left by a run that was resumed from an earlier checkpoint) are not touched.
    """
    for path in root.iterdir():
        stale = re.fullmatch(r"\.(tmp|old)-(step-\d+)-.*", path.name)
        if stale and path.is_dir() and (stale.group(1) == "tmp" or (root / stale.group(2)).is_dir()):
            shutil.rmtree(path, ignore_errors=True)
    if keep is None:
        return
    done = [p for p in step_dirs(root) if (n := step_of(p)) is not None and n <= step]  # step_dirs: all numbered
    for path in done[:-keep]:
        shutil.rmtree(path, ignore_errors=True)


def load_training_checkpoint(
    run_dir: str | Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    generators: dict[str, torch.Generator] | None = None,
    scaler: Any = None,
    map_location: str | torch.device = "cpu",
) -> dict[str, Any]:
    """Restore the latest checkpoint of ``run_dir`` into the given objects; return the trainer_state dict.

    The model and optimizer must be built the same way as in the saved run. Random-number generators are
    restored last, so the next dropout mask and the next batch are the ones the saved run would have drawn.
    The returned dict always has the checkpoint's "step".
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise QkvError(f"run directory {run_dir} does not exist: check the path, or start a new run")
    where = latest_checkpoint(run_dir)
    if where is None:
        raise QkvError(
            f"{run_dir} has no training checkpoint to resume from: start a new run, "
            f"or give the run directory that has {CHECKPOINTS_DIR}/"
        )
    fix = f"delete {where} to resume from the checkpoint before it, or start a new run"
    document = read_json(where / STATE_FILE, what="trainer state")
    if not isinstance(document, dict) or document.get("format") != FORMAT or "rng" not in document:
        raise QkvError(f"{STATE_FILE} in {where} is not a qkv training checkpoint: {fix}")
    tensors, _ = read_tensors(where / OPTIMIZER_FILE, device=map_location, fix=fix)
    load_weights(model, where / MODEL_FILE, fix=fix)

    saved_optimizer = document.get("optimizer")
    if optimizer is not None:
        if not saved_optimizer:
            raise QkvError(f"{where} holds no optimizer state: resume without an optimizer, or start a new run")
        saved_class, current = saved_optimizer.get("class"), type(optimizer).__name__
        if saved_class != current:
            raise QkvError(
                f"{where} was saved with the {saved_class} optimizer but this run uses {current}: "
                "resume with the same optimizer, or start a new run"
            )
        state_dict = _decode({k: v for k, v in saved_optimizer.items() if k != "class"}, tensors, where)
        state_dict["state"] = {int(index): value for index, value in state_dict.get("state", {}).items()}
        try:
            optimizer.load_state_dict(state_dict)
        except (ValueError, KeyError, TypeError, RuntimeError) as error:
            raise QkvError(
                f"the optimizer state in {where} does not fit this optimizer ({error}): resume with the "
                "same model and optimizer settings, or start a new run"
            ) from None
    if scaler is not None and document.get("scaler"):
        scaler.load_state_dict(document["scaler"])
    _restore_rng(_decode(document["rng"], tensors, where), generators or {}, where)
    state = dict(_decode(document.get("trainer_state") or {}, tensors, where))
    state.setdefault("step", document["step"])
    return state
