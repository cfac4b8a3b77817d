"""Starting or resuming a run, the same way for every task.

A task supplies a ``prepare`` function that turns the settings into a model, a :class:`~qkv.training.trainer.Task`
and tokenizers (trained anew, or read back from the run directory when resuming). Everything else is
shared: the session (device, precision, processes), the run directory and its saved settings, the check
that resumed data is unchanged, the trainer, the loss curve at the end.
"""

from __future__ import annotations

import gc
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.model_dir import save_model_dir
from qkv.tokenizers import Tokenizer
from qkv.training.checkpoint import clean_leftovers
from qkv.training.config import TrainConfig
from qkv.training.distributed import broadcast_object, shutdown_distributed
from qkv.training.plot import plot_losses
from qkv.training.run import Session, check_same_data, load_run_config, new_run_dir, save_run_config, start_session
from qkv.training.tasks.protocol import Task
from qkv.training.trainer import Trainer, TrainResult, resume_available


@dataclass
class Prepared:
    """What a task's ``prepare`` returns."""

    model: nn.Module
    task: Task
    tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None = None
    data_info: dict[str, Any] = field(default_factory=dict)  # name, source, sha256 of the data
    summary: list[str] = field(default_factory=list)  # lines to print before training
    # Fine-tuning (qkv.training.tasks.finetune) writes its own files: the run folder's first files (start) and
    # the best model (save_best: the whole model, or LoRA's adapters), checkpoints only the adapters of a LoRA
    # model (checkpointed), and evaluates once before the first step (evaluate_first).
    save_start: Callable[[Path], None] | None = None
    save_best: Callable[[Path, nn.Module, dict[str, Tensor] | None], None] | None = None
    checkpointed: nn.Module | None = None
    evaluate_first: bool = False


# prepare(config, resume_dir or None, session, say) -> Prepared; say.enabled is False when say prints nothing
Prepare = Callable[[TrainConfig, Path | None, Session, Callable[[str], None]], Prepared]


def disk_error(error: OSError, run_dir: Path) -> QkvError:
    """The one line for a write that failed mid-run: which path, what the system said, that the last checkpoint
    is whole (checkpoints are written to a temporary folder and renamed only when complete), how to go on."""
    from qkv.training.checkpoint import latest_checkpoint

    path = error.filename or run_dir
    kept = latest_checkpoint(run_dir)
    where = f"the last checkpoint {kept} is intact" if kept else "no checkpoint had been saved yet"
    return QkvError(
        f"could not write {path} ({error.strerror or error}); {where}: free some space or make {run_dir} "
        f"writable, then continue with `qkv train --resume {run_dir}`"
    )


def run_training(
    config: TrainConfig,
    prepare: Prepare,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
) -> TrainResult:
    """Train (or, with ``resume``, continue) the model that ``prepare`` builds; return the result.

    Under torchrun the process group is joined here and left at the end, unless the caller had joined it.
    """
    caller_group = torch.distributed.is_available() and torch.distributed.is_initialized()
    session = start_session(config)
    is_main = session.dist.is_main

    def say(text: str) -> None:
        if is_main and not quiet:
            print(text, file=sys.stderr, flush=True)

    say.enabled = is_main and not quiet  # type: ignore[attr-defined]  # tasks show their own progress bars too

    try:
        return _train(config, prepare, session, say, resume=resume, quiet=quiet, on_step=on_step)
    except BaseException as error:
        traceback.clear_frames(error.__traceback__)  # the failed run's model and trainer go before the group does
        raise
    finally:
        if not caller_group:
            # The DDP wrapper's reducer holds the process group; freed after the group was destroyed, it would
            # destroy gloo's group inside its own destructor, holding the GIL that gloo's worker thread waits for
            # (a hang at exit). So the trainer and the model are gone (cycles collected) before the group.
            gc.collect()
            shutdown_distributed()


def _train(
    config: TrainConfig,
    prepare: Prepare,
    session: Session,
    say: Callable[[str], None],
    *,
    resume: str | Path | None,
    quiet: bool,
    on_step: Callable | None,
) -> TrainResult:
    """The run itself: prepare the model and data, make or reopen its folder, fit, draw the loss curve."""
    is_main = session.dist.is_main
    resume_dir = Path(resume) if resume is not None else None
    saved_data = load_run_config(resume_dir)[1] if resume_dir is not None else None
    prepared = prepare(config, resume_dir, session, say)
    if resume_dir is not None:
        assert saved_data is not None  # read above for every resumed run
        check_same_data(prepared.data_info, saved_data, resume_dir)
        run_dir = resume_dir
    else:
        run_dir = _new_run_dir(config, prepared, session)
    _announce(prepared, session, run_dir, say)
    trainer = Trainer(
        prepared.model,
        prepared.task,
        config,
        run_dir,
        device=session.device,
        precision=session.precision,
        save_best=_best_saver(prepared, run_dir),
        dist=session.dist,
        quiet=quiet,
        on_step=on_step,
        checkpointed=prepared.checkpointed,
        evaluate_first=prepared.evaluate_first,
    )
    if resume_dir is not None:
        _pick_up(trainer, run_dir, config, is_main, say)
    try:
        result = trainer.fit()
    except OSError as error:  # a full or read-only disk while writing metrics, the best model or a checkpoint
        raise disk_error(error, run_dir) from None
    if is_main:
        plot_losses(run_dir, required=False)  # a run stopped before its first log line has no curve
    return result


def _new_run_dir(config: TrainConfig, prepared: Prepared, session: Session) -> Path:
    """A fresh run folder (named on the main process, the same for all), holding from the start what loading
    the model needs (config, tokenizers; fine-tuning writes its own) and the run's settings."""
    is_main = session.dist.is_main
    run_dir = Path(broadcast_object(str(new_run_dir(config.out_dir, config.task)) if is_main else None, session.dist))
    if is_main and prepared.save_start is not None:
        prepared.save_start(run_dir)
    elif is_main:
        save_model_dir(run_dir, prepared.model, prepared.tokenizer, prepared.target_tokenizer, weights_name=None)
    if is_main:
        save_run_config(run_dir, config, prepared.data_info)
    return run_dir


def _announce(prepared: Prepared, session: Session, run_dir: Path, say: Callable[[str], None]) -> None:
    """The lines printed before training: the task's summary, the device and the run folder."""
    for line in prepared.summary:
        say(line)
    say(f"device: {session.device}" + (f" x {session.dist.world_size} processes" if session.dist.enabled else ""))
    say(f"run directory: {run_dir}")


def _best_saver(prepared: Prepared, run_dir: Path) -> Callable[[nn.Module, dict[str, Tensor] | None], None]:
    """The trainer's ``save_best``: the task's own saver (fine-tuning), or the whole model directory."""

    def save_best(model: nn.Module, weights: dict[str, Tensor] | None = None) -> None:
        if prepared.save_best is not None:
            prepared.save_best(run_dir, model, weights)
            return
        save_model_dir(run_dir, model, prepared.tokenizer, prepared.target_tokenizer, state=weights)

    return save_best


def _pick_up(trainer: Trainer, run_dir: Path, config: TrainConfig, is_main: bool, say: Callable[[str], None]) -> None:
    """A resumed run: clear half-written leftovers, then load the latest checkpoint, or (stopped before its
    first one) start again from step 0 with the same seed."""
    if is_main:
        for path in clean_leftovers(run_dir):
            say(f"removed {path}, left half-written when the run was stopped")
    if resume_available(run_dir):
        trainer.resume()
        say(f"resuming at step {trainer.state.step} of {config.steps}")
    else:
        trainer.metrics.truncate_after(0)
        say(f"{run_dir} was stopped before its first checkpoint: starting it again from step 0")
