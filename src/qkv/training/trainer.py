"""The training loop shared by every task (language modelling, translation).

One optimizer step:

    for each micro-batch (gradient accumulation):  loss = task.loss(model, batch);  loss.backward()
    clip the gradient norm;  set the learning rate for this step;  AdamW step;  zero the gradients

Around it: evaluation every ``eval_interval`` steps (the best model by the task's metric is saved as the
run's ``model.safetensors``), resumable checkpoints, a metrics log, a progress bar, a NaN/inf guard that
stops before anything bad is saved, Ctrl-C that saves a checkpoint and exits cleanly, DDP or FSDP when run
under torchrun, and torch.compile (:mod:`qkv.training.strategy`). What is task-specific (batches, loss,
evaluation) comes from a :class:`Task`.

The loop does not wait for the device between steps: the losses stay on the device and are read (one host
sync) only every ``log_interval`` steps and before an evaluation, a checkpoint or a stop
(:mod:`qkv.training.loss_window`); the NaN/inf guard looks there, so nothing bad is ever saved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.models.eval_mode import eval_mode
from qkv.models.family import family_of
from qkv.training.checkpoint import all_finite, latest_checkpoint, load_training_checkpoint, save_training_checkpoint
from qkv.training.config import TrainConfig
from qkv.training.device import Precision
from qkv.training.distributed import DistInfo, any_rank, mean_over_ranks
from qkv.training.interrupts import stop_on_signals
from qkv.training.loss_window import LossWindow
from qkv.training.metrics import MetricsLog
from qkv.training.optim import make_optimizer
from qkv.training.progress import TrainingProgress
from qkv.training.schedule import FIT_AFTER, duration, fit_to_time, learning_rate
from qkv.training.state import LoopState, TrainingDiverged, TrainResult, TrainState
from qkv.training.strategy import (
    TrainingModel,
    full_model_state,
    full_optimizer_state,
    shard_optimizer_state,
    use_compile,
)
from qkv.training.tasks.protocol import Task, UpdatingTask


class Trainer:
    """Trains ``model`` on ``task`` according to ``config``, writing everything to ``run_dir``.

    ``save_best(model, weights)`` is called (on the main process) whenever the evaluation metric improves;
    it writes the run's model directory (weights, config, tokenizer). ``weights`` is None, or the whole
    tensors gathered from a sharded model, to save in place of ``model.state_dict()``. ``on_step(trainer,
    step, loss)`` is called after every step with the step's mean loss as a 0-dim tensor on the device
    (reading it with ``.item()`` waits for the device). ``checkpointed``: the module whose weights a checkpoint
    holds (default the model; a LoRA run's adapters alone, :class:`~qkv.models.lora.AdapterWeights`);
    ``evaluate_first``: evaluate before the first step too (fine-tuning: the pretrained model's loss, row 0).
    """

    def __init__(
        self,
        model: nn.Module,
        task: Task,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        device: torch.device,
        precision: Precision,
        save_best: Callable[[nn.Module, dict[str, Tensor] | None], None],
        dist: DistInfo | None = None,
        quiet: bool = False,
        on_step: Callable[[Trainer, int, Tensor], None] | None = None,
        checkpointed: nn.Module | None = None,
        evaluate_first: bool = False,
    ) -> None:
        self.model, self.task, self.config = model, task, config
        self.width = family_of(model).model_width(model.config)  # d_model, which the paper's schedule scales by
        # What a checkpoint holds: the model, or (LoRA) a module of the trained adapters alone.
        self.checkpointed = model if checkpointed is None else checkpointed
        self.evaluate_first = evaluate_first  # fine-tuning: the validation loss before the first step
        self.run_dir = Path(run_dir)
        self.device, self.precision, self.save_best = device, precision, save_best
        self.dist = dist or DistInfo()
        self.quiet, self.on_step = quiet, on_step
        # Shard (FSDP) before the optimizer is made: it must hold the sharded parameters.
        self.training_model = TrainingModel(
            model,
            strategy=config.strategy,
            dist_info=self.dist,
            device=device,
            compile=use_compile(config.compile, device),
        )
        self.optimizer = make_optimizer(
            model,
            lr=config.lr,
            weight_decay=config.weight_decay,
            betas=(config.beta1, config.beta2),
            device_type=device.type,
            kind=config.optimizer,
            muon_lr=config.muon_lr,
            muon_ns_steps=config.muon_ns_steps,
            distributed=self.dist.enabled,
        )
        self.scaler = precision.scaler()
        self.task_updates = callable(getattr(task, "update", None)) and not self.dist.enabled
        self.compile_seconds = 0.0
        self.metrics = MetricsLog(self.run_dir, enabled=self.dist.is_main)
        self.state = TrainState()
        self._stop_requested = False
        self._saved_step: int | None = None

    # --- control ------------------------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Finish the current step, save a checkpoint and return (what Ctrl-C does)."""
        self._stop_requested = True

    # --- checkpoints ------------------------------------------------------------------------------------------
    def resume(self) -> None:
        """Load the latest checkpoint of ``run_dir``: weights, optimizer, data order, RNG, step."""
        state = load_training_checkpoint(
            self.run_dir,
            model=self.checkpointed,
            optimizer=self.optimizer,
            scaler=self.scaler,
            map_location=self.device,
        )
        shard_optimizer_state(self.optimizer)  # under FSDP: each process keeps its rows of the whole tensors
        self.task.load_state_dict(state.pop("data"))
        known = {f.name for f in fields(TrainState)}
        if not isinstance(state, dict) or not set(state) <= known:
            raise QkvError(
                f"the trainer state of {latest_checkpoint(self.run_dir)} is damaged (unknown fields "
                f"{sorted(set(state) - known)}): remove that checkpoint folder to resume from the one before"
            )
        if any_rank(not all_finite(self.model), self.dist, self.device):  # saved by a qkv that did not check
            raise QkvError(
                f"the checkpoint {latest_checkpoint(self.run_dir)} holds NaN or infinite weights (saved after training "
                "diverged): remove that folder to resume from the one before, or start again with a lower --lr"
            )
        self.state = TrainState(**state)
        self.metrics.truncate_after(self.state.step)

    def save_checkpoint(self) -> Path | None:
        """Save a resumable checkpoint of the current step (once per step; every process gathers, rank 0 writes)."""
        if self._saved_step == self.state.step:
            return latest_checkpoint(self.run_dir) if self.dist.is_main else None
        if any_rank(not all_finite(self.model), self.dist, self.device):  # never a checkpoint that cannot resume
            raise self._diverged(f"the weights became NaN or infinite by step {self.state.step}")
        self._saved_step = self.state.step
        model_state = full_model_state(self.checkpointed)  # whole tensors of a sharded model (collective), else None
        optimizer_state = full_optimizer_state(self.optimizer)
        if not self.dist.is_main:
            return None
        return save_training_checkpoint(
            self.run_dir,
            step=self.state.step,
            model=self.checkpointed,
            optimizer=self.optimizer,
            trainer_state={**self.state.to_dict(), "data": self.task.state_dict()},
            scaler=self.scaler,
            keep=self.config.keep_checkpoints,
            model_state=model_state,
            optimizer_state=optimizer_state,
        )

    # --- the loop ---------------------------------------------------------------------------------------------
    def _set_lr(self) -> float:
        cfg = self.config
        assert cfg.min_lr is not None  # TrainConfig.__post_init__ sets lr / 10 for none
        lr = learning_rate(
            self.state.step,
            schedule=cfg.schedule,
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            warmup=cfg.warmup_steps if self.state.schedule_warmup is None else self.state.schedule_warmup,
            total=self.state.schedule_steps or cfg.steps,
            d_model=self.width,
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)  # Muon's groups run at a larger rate than AdamW's
        return lr

    def _train_step(self) -> tuple[Tensor, int]:
        """Forward and backward over ``grad_accum`` micro-batches; returns the mean loss and token count."""
        if self.task_updates:  # the task applies its own step (see Task)
            batch = self.task.train_batch(self.dist.rank, self.dist.world_size)
            loss, n_tokens = cast(UpdatingTask, self.task).update(self.model, batch)
            return loss.detach().float(), n_tokens
        accum = self.config.grad_accum
        total_loss, total_tokens = torch.zeros((), device=self.device), 0
        for micro in range(accum):
            batch = self.task.train_batch(self.dist.rank, self.dist.world_size)
            with self.training_model.gradient_sync(micro == accum - 1):
                with self.precision.autocast():
                    loss, n_tokens = self.task.loss(self.training_model.step_model, batch)
                scaled = loss / accum
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            total_loss += loss.detach().float()
            total_tokens += n_tokens
        return total_loss / accum, total_tokens

    def _optimizer_step(self) -> None:
        if self.task_updates:
            return
        if self.config.grad_clip > 0:
            if self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _diverged(self, what: str, lr: float | None = None) -> TrainingDiverged:
        """Checkpoints are saved only with finite weights, so the latest one is a good one."""
        kept = latest_checkpoint(self.run_dir)
        where = f"the last good checkpoint {kept} is kept" if kept else "no checkpoint had been saved yet"
        rate = "" if lr is None else f" (learning rate {lr:.3g})"
        return TrainingDiverged(
            f"{what}{rate}; training stopped and {where}: lower --lr or keep --grad-clip on, then resume or restart"
        )

    def _read_losses(self, window: LossWindow) -> float | None:
        """Read the pending losses (one host sync); stop if one is not finite, on any process (all read at
        the same steps, so all stop together). Returns the last step's loss, or None."""
        last, bad = window.read()
        if any_rank(bad is not None, self.dist, self.device):
            step, value, lr = bad or (self.state.step, float("nan"), 0.0)  # another process diverged
            raise self._diverged(f"the training loss became {value} at step {step}", lr)
        return last

    def _keep_window(self, window: LossWindow) -> None:
        """Put the (read) loss window's partial sums into the state a checkpoint saves."""
        self.state.window_loss_sum, self.state.window_steps = window.loss_sum, window.steps

    def _fit_schedule(self, step: int, done: int, seconds: float, session: float, progress: TrainingProgress) -> None:
        """Under --max-time, once: the schedule spans the steps that fit (:func:`~qkv.training.schedule.fit_to_time`),
        the same on every process, saved with the checkpoints."""
        cfg = self.config
        if cfg.max_time is None or self.state.schedule_steps is not None:
            return
        rate = mean_over_ranks(done / seconds, self.dist, self.device)  # steps/s, agreed by every process
        fitted = fit_to_time(step, rate, cfg.max_time * 60 - session, steps=cfg.steps, warmup=cfg.warmup_steps)
        if fitted is not None:
            self.state.schedule_steps, self.state.schedule_warmup = fitted
            progress.expect(fitted[0])
            progress.note(f"--max-time {duration(cfg.max_time)} fits about {fitted[0]} of the {cfg.steps} steps at "
                          f"{rate:.1f} steps/s: the learning-rate schedule now spans {fitted[0]} steps "
                          f"(warmup {fitted[1]})")  # fmt: skip

    def evaluate(self) -> dict[str, float]:
        with eval_mode(self.model), self.precision.autocast():
            return self.task.evaluate(self.model)

    def _after_eval(self, results: dict[str, float], progress: TrainingProgress) -> bool:
        """Record an evaluation, keep the best model; True if early stopping says stop."""
        self.state.last_eval = results
        self.metrics.write({"step": self.state.step, **results})
        value = results[self.task.metric]
        better = self.state.best is None or (
            value > self.state.best if self.task.higher_is_better else value < self.state.best
        )
        better = any_rank(better, self.dist, self.device)  # all processes must join the gathering below
        summary = "  ".join(f"{k} {v:.4f}" for k, v in results.items())
        if better:
            self.state.best, self.state.evals_since_best = value, 0
            weights = full_model_state(self.model)  # collective under FSDP
            if self.dist.is_main:
                self.save_best(self.model, weights)
            progress.note(f"step {self.state.step}: {summary}  (best so far, saved)")
        else:
            self.state.evals_since_best += 1
            progress.note(f"step {self.state.step}: {summary}")
        return 0 < self.config.early_stop <= self.state.evals_since_best

    def _evaluate_before(self, progress: TrainingProgress) -> None:
        """The metric before the first step (a pretrained model's, before fine-tuning changes it): row 0."""
        self.state.before = self.evaluate()
        self.metrics.write({"step": 0, **self.state.before})
        progress.note("before training: " + "  ".join(f"{k} {v:.4f}" for k, v in self.state.before.items()))

    def _step(self, loop: LoopState, progress: TrainingProgress) -> str | None:
        """One optimizer step and what follows it (reading the losses, the metrics row, an evaluation, a
        checkpoint); why the loop stops here ("time limit", "early stop", "interrupted"), or None."""
        cfg = self.config
        assert cfg.checkpoint_interval is not None  # TrainConfig.__post_init__ defaults it to eval_interval
        step_start = time.perf_counter()
        lr = self._set_lr()
        loss, n_tokens = self._train_step()
        self._optimizer_step()
        self.state.step += 1
        step = self.state.step
        n_tokens *= self.dist.world_size
        self.state.tokens += n_tokens
        loop.window.add(loss, lr, n_tokens)
        out_of_time = cfg.max_time is not None and any_rank(
            time.perf_counter() - loop.session_start >= cfg.max_time * 60, self.dist, self.device
        )
        last_step = step == cfg.steps or out_of_time
        log = step % cfg.log_interval == 0 or last_step
        evaluate = step % cfg.eval_interval == 0 or last_step
        save = step % cfg.checkpoint_interval == 0 or last_step
        compiled_first = self.training_model.compiled and step == loop.first_step
        if log or evaluate or save or compiled_first:
            last = self._read_losses(loop.window)
            loop.shown_loss = loop.shown_loss if last is None else last
            loop.speed = loop.window.tokens_per_s
        self.state.elapsed += time.perf_counter() - step_start
        self._time_step(loop, step, step_start, compiled_first, progress)
        progress.update(step, loss=loop.shown_loss, lr=lr, tokens_per_s=loop.speed)
        if log:
            mean_loss = mean_over_ranks(loop.window.mean_loss, self.dist, self.device)
            self.metrics.write({"step": step, "train_loss": mean_loss, "lr": lr, "tokens_per_s": loop.speed})
            loop.window = LossWindow(first_step=step + 1)
        if self.on_step is not None:
            self.on_step(self, step, loss)
        return self._after_step(loop, evaluate=evaluate, save=save, out_of_time=out_of_time, log=log, progress=progress)

    def _time_step(
        self, loop: LoopState, step: int, step_start: float, compiled_first: bool, progress: TrainingProgress
    ) -> None:
        """The clocks after a step: timing starts after the first step (compiling, warming caches); after
        ``FIT_AFTER`` timed steps, --max-time fits the schedule; the first compiled step's time is noted."""
        if step == loop.first_step:
            loop.timed_from = time.perf_counter()
        elif step - loop.first_step == FIT_AFTER:
            self._fit_schedule(step, step - loop.first_step, time.perf_counter() - loop.timed_from,
                               time.perf_counter() - loop.session_start, progress)  # fmt: skip
        if compiled_first:
            self.compile_seconds = time.perf_counter() - step_start
            progress.note(f"torch.compile: the first step took {self.compile_seconds:.1f} s (compiling)")

    def _after_step(
        self, loop: LoopState, *, evaluate: bool, save: bool, out_of_time: bool, log: bool, progress: TrainingProgress
    ) -> str | None:
        """Evaluate and save as due, then stop for the time limit, early stopping or a requested stop (each
        leaving a checkpoint); the reason, or None to go on."""
        cfg = self.config
        stop_early = self._after_eval(self.evaluate(), progress) if evaluate else False
        if save:
            self._keep_window(loop.window)
            self.save_checkpoint()
        if out_of_time and not stop_early:
            assert cfg.max_time is not None  # out_of_time only under a limit
            progress.note(f"--max-time {duration(cfg.max_time)} reached at step {self.state.step}: stopping")
            return "time limit"
        if stop_early:
            progress.note(f"no improvement in {cfg.early_stop} evaluations: stopping early")
            self._keep_window(loop.window)
            self.save_checkpoint()
            return "early stop"
        # Under torchrun the processes agree on stopping at logging steps (a collective).
        if self.dist.enabled and not log:
            return None
        if any_rank(self._stop_requested, self.dist, self.device):
            self._read_losses(loop.window)  # nothing not finite goes into the checkpoint
            self._keep_window(loop.window)
            path = self.save_checkpoint()
            progress.note(f"interrupted at step {self.state.step}: checkpoint saved to {path}")
            return "interrupted"
        return None

    def fit(self) -> TrainResult:
        """Train from ``self.state.step`` to ``config.steps`` (call :meth:`resume` first to continue)."""
        cfg = self.config
        progress = TrainingProgress(
            cfg.steps, self.state.step, enabled=self.dist.is_main and not self.quiet, log_interval=cfg.log_interval
        )
        if self.evaluate_first and self.state.step == 0:
            self._evaluate_before(progress)
        self.model.train()
        stopped = "finished"
        loop = LoopState.starting(self.state, time.perf_counter())  # a resumed run continues its loss window
        try:
            with stop_on_signals(self):  # the first Ctrl-C stops after this step, with a checkpoint
                while self.state.step < cfg.steps:
                    reason = self._step(loop, progress)
                    if reason is not None:
                        stopped = reason
                        break
        finally:
            progress.close()
        if self.dist.is_main:
            self.metrics.write_csv()
        return self.state.result(stopped, self.run_dir, compile_seconds=self.compile_seconds, metric=self.task.metric)


def resume_available(run_dir: str | Path) -> bool:
    return latest_checkpoint(run_dir) is not None
