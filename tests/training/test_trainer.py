"""The training loop: exact resume, the NaN guard, best-model saving, early stopping."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from qkv.training import TrainConfig, train_language_model
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.metrics import read_metrics
from qkv.training.trainer import TrainingDiverged

TEXT = (
    "To be, or not to be, that is the question:\n"
    "Whether 'tis nobler in the mind to suffer\n"
    "The slings and arrows of outrageous fortune,\n"
    "Or to take arms against a sea of troubles\n"
) * 30


def tiny_config(tmp_path, name: str, **kw) -> TrainConfig:
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    settings = dict(
        data=str(data),
        out_dir=str(tmp_path / name),
        preset="gpt-nano",
        steps=12,
        batch_size=4,
        warmup_steps=2,
        eval_interval=4,
        eval_batches=2,
        log_interval=1,
        lr=3e-3,
        model={"context_length": 32, "dropout": 0.1},
    )
    settings.update(kw)
    return TrainConfig(**settings)


def train_losses(run_dir) -> dict[int, float]:
    return {r["step"]: r["train_loss"] for r in read_metrics(run_dir) if "train_loss" in r}


def test_interrupted_and_resumed_run_equals_the_uninterrupted_run(tmp_path) -> None:
    # bit for bit: on the CPU (a GPU's parallel sums have no fixed order)
    whole = train_language_model(tiny_config(tmp_path, "whole", device="cpu"), quiet=True)
    assert whole.stopped == "finished" and whole.step == 12

    def stop_at_5(trainer, step, loss) -> None:
        if step == 5:
            trainer.request_stop()  # what Ctrl-C does

    config = tiny_config(tmp_path, "split", device="cpu")
    first = train_language_model(config, quiet=True, on_step=stop_at_5)
    assert first.stopped == "interrupted" and first.step == 5
    second = train_language_model(config, resume=config.out_dir, quiet=True)
    assert second.step == 12

    assert train_losses(config.out_dir) == train_losses(whole.run_dir)  # bit-for-bit the same losses
    a = load_file(str(latest_checkpoint(whole.run_dir) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(config.out_dir) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path) -> None:
    def poison(trainer, step, loss) -> None:
        if step == 6:
            with torch.no_grad():
                next(trainer.model.parameters()).fill_(float("nan"))

    config = tiny_config(tmp_path, "nan", checkpoint_interval=2, eval_interval=2)
    with pytest.raises(TrainingDiverged, match="weights became NaN or infinite by step 6") as info:
        train_language_model(config, quiet=True, on_step=poison)
    assert "the last good checkpoint" in str(info.value) and "step-000004" in str(info.value)
    kept = latest_checkpoint(config.out_dir)
    assert kept.name == "step-000004"  # step 6's weights are NaN: never saved as a checkpoint to resume from
    for weights in (kept / "model.safetensors", tmp_path / "nan" / "model.safetensors"):  # and the best model
        assert all(torch.isfinite(t).all() for t in load_file(str(weights)).values())
    state = json.loads((kept / "trainer_state.json").read_text())
    assert state["step"] == 4


def test_best_model_and_metrics_are_written(tmp_path) -> None:
    result = train_language_model(tiny_config(tmp_path, "run"), quiet=True)
    run = result.run_dir
    for name in (
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "train_config.json",
        "metrics.jsonl",
        "metrics.csv",
        "loss.png",
    ):
        assert (run / name).exists(), name
    evals = [r for r in read_metrics(run) if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert result.best == min(r["val_loss"] for r in evals)
    assert math.isfinite(result.best) and result.best < math.log(40)  # better than uniform over the vocabulary


def test_a_run_stopped_before_its_first_log_line_ends_cleanly(tmp_path) -> None:
    def stop_at_once(trainer, step, loss) -> None:
        trainer.request_stop()  # Ctrl-C before anything was logged or evaluated

    config = tiny_config(tmp_path, "early-stop", log_interval=50, eval_interval=50)
    result = train_language_model(config, quiet=True, on_step=stop_at_once)
    assert result.stopped == "interrupted" and result.step == 1
    assert latest_checkpoint(config.out_dir) is not None  # the step is saved; no loss curve to draw
    assert not (result.run_dir / "loss.png").exists()


def test_early_stopping(tmp_path) -> None:
    config = tiny_config(
        tmp_path, "early", optimizer="adamw", lr=1e-9, min_lr=0.0, steps=40, early_stop=1, eval_interval=2
    )
    result = train_language_model(config, quiet=True)
    assert result.stopped == "early stop" and result.step < 40


def test_gradient_accumulation_equals_one_larger_batch(tmp_path) -> None:
    """Two micro-batches of 4 give the same update as one batch of 8 (the same 8 windows, mean loss)."""
    model = {"context_length": 32, "dropout": 0.0}  # on the CPU: the same numbers to 1e-5, no TF32 or bfloat16
    common = dict(steps=3, eval_interval=3, optimizer="adamw", model=model, device="cpu")
    big = train_language_model(tiny_config(tmp_path, "big", batch_size=8, **common), quiet=True)
    accumulated = train_language_model(tiny_config(tmp_path, "acc", batch_size=4, grad_accum=2, **common), quiet=True)
    a = load_file(str(latest_checkpoint(big.run_dir) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(accumulated.run_dir) / "model.safetensors"))
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-4, msg=key)
