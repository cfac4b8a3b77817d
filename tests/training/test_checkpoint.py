"""Resumable training checkpoints: exact resume, crash safety, pruning, and no pickle."""

from __future__ import annotations

import json
import os
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

import qkv.training.checkpoint as training_checkpoint
from qkv.errors import QkvError
from qkv.models import GPT, GPTConfig
from qkv.training.checkpoint import (
    LATEST_FILE,
    OPTIMIZER_FILE,
    latest_checkpoint,
    load_training_checkpoint,
    save_training_checkpoint,
)

CONFIG = GPTConfig(vocab_size=16, d_model=16, n_heads=2, n_layers=1, context_length=8, dropout=0.2)


def make_optimizer(model: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), fused=kind == "adamw-fused")


def train(model, optimizer, batches: torch.Generator, steps: int) -> None:
    """Dropout (global torch RNG), batch sampling (``batches``) and Python's RNG all feed the updates."""
    model.train()
    for _ in range(steps):
        ids = torch.randint(0, CONFIG.vocab_size, (4, CONFIG.context_length), generator=batches)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()) * (1 + random.random())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def fresh(kind: str, seed: int):
    torch.manual_seed(seed)
    model = GPT(CONFIG)
    return model, make_optimizer(model, kind), torch.Generator().manual_seed(seed)


def save(run_dir: Path, step: int, model=None, optimizer=None, **kw) -> Path:
    if model is None:
        model, optimizer, _ = fresh("adamw", step)
    return save_training_checkpoint(
        run_dir, step=step, model=model, optimizer=optimizer, trainer_state={"step": step, "best": 1.5}, **kw
    )


@pytest.mark.parametrize("kind", ["adamw", "adamw-fused", "sgd"])
def test_resume_is_bit_identical_to_never_stopping(tmp_path, kind):
    random.seed(0)
    model, optimizer, batches = fresh(kind, 0)
    train(model, optimizer, batches, 3)
    save_training_checkpoint(
        tmp_path, step=3, model=model, optimizer=optimizer, trainer_state={"epoch": 1}, generators={"batches": batches}
    )
    train(model, optimizer, batches, 3)
    uninterrupted = {name: p.detach().clone() for name, p in model.named_parameters()}

    random.seed(123)  # a new process: different initial weights, RNG states and optimizer
    resumed, resumed_optimizer, resumed_batches = fresh(kind, 99)
    state = load_training_checkpoint(
        tmp_path, model=resumed, optimizer=resumed_optimizer, generators={"batches": resumed_batches}
    )
    assert state == {"epoch": 1, "step": 3}
    train(resumed, resumed_optimizer, resumed_batches, 3)
    for name, parameter in resumed.named_parameters():
        assert torch.equal(parameter, uninterrupted[name]), name
    assert resumed.unembedding.weight is resumed.embedding.token_embedding.weight

    # The same resume without the random states goes elsewhere: the comparison above can fail.
    other, other_optimizer, other_batches = fresh(kind, 99)
    load_training_checkpoint(tmp_path, model=other, optimizer=other_optimizer)
    train(other, other_optimizer, other_batches, 3)
    assert not torch.equal(other.unembedding.weight, uninterrupted["embedding.token_embedding.weight"])


def test_optimizer_settings_round_trip_with_their_types(tmp_path):
    model, optimizer, batches = fresh("adamw-fused", 0)
    train(model, optimizer, batches, 1)
    save(tmp_path, 1, model, optimizer)
    other, other_optimizer, _ = fresh("adamw", 1)
    load_training_checkpoint(tmp_path, model=other, optimizer=other_optimizer)
    for saved, loaded in zip(optimizer.param_groups, other_optimizer.param_groups, strict=True):
        assert type(loaded["betas"]) is tuple and loaded["betas"] == (0.9, 0.95)
        assert loaded["weight_decay"] == saved["weight_decay"] and loaded["fused"] is True
    for parameter, other_parameter in zip(model.parameters(), other.parameters(), strict=True):
        for key, value in optimizer.state[parameter].items():
            assert torch.equal(other_optimizer.state[other_parameter][key], value), key


def test_rng_states_are_restored(tmp_path):
    model, optimizer, batches = fresh("adamw", 0)
    sampler = torch.Generator().manual_seed(7)
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    save(tmp_path, 1, model, optimizer, generators={"sampler": sampler})
    expected = (random.random(), np.random.rand(), torch.rand(3), torch.rand(3, generator=sampler))
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    sampler.manual_seed(9)
    load_training_checkpoint(tmp_path, model=model, optimizer=optimizer, generators={"sampler": sampler})
    got = (random.random(), np.random.rand(), torch.rand(3), torch.rand(3, generator=sampler))
    assert got[:2] == expected[:2]
    assert torch.equal(got[2], expected[2]) and torch.equal(got[3], expected[3])
    with pytest.warns(UserWarning, match="no state for generator 'other'"):
        load_training_checkpoint(tmp_path, model=model, optimizer=optimizer, generators={"other": sampler})


def test_grad_scaler_state_round_trips(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    save(tmp_path, 1, scaler=scaler)
    restored = torch.amp.GradScaler("cpu")
    model, optimizer, _ = fresh("adamw", 1)
    load_training_checkpoint(tmp_path, model=model, optimizer=optimizer, scaler=restored)
    assert restored.state_dict() == scaler.state_dict()


def test_layout_and_latest_pointer(tmp_path):
    step_dir = save(tmp_path, 5)
    assert step_dir == tmp_path / "checkpoints" / "step-000005"
    assert {p.name for p in step_dir.iterdir()} == {"model.safetensors", "optimizer.safetensors", "trainer_state.json"}
    assert json.loads((tmp_path / "checkpoints" / LATEST_FILE).read_text()) == {"step": 5, "dir": "step-000005"}
    assert latest_checkpoint(tmp_path) == step_dir
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_keep_prunes_old_step_folders_after_the_pointer_moves(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == [LATEST_FILE, "step-000003", "step-000004"]
    assert load_training_checkpoint(tmp_path, model=GPT(CONFIG), optimizer=None)["step"] == 4
    for step in (5, 6, 7):
        save(tmp_path, step, keep=None)
    assert len(list((tmp_path / "checkpoints").glob("step-*"))) == 5


def test_saving_a_step_again_replaces_it(tmp_path):
    save(tmp_path, 1)
    model, optimizer, _ = fresh("adamw", 42)
    save(tmp_path, 1, model, optimizer)
    loaded = GPT(CONFIG)
    load_training_checkpoint(tmp_path, model=loaded, optimizer=None)
    assert torch.equal(loaded.unembedding.weight, model.unembedding.weight)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".")] == []


def test_crash_while_writing_latest_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    first, first_optimizer, _ = fresh("adamw", 1)
    save(tmp_path, 1, first, first_optimizer)
    real_replace = os.replace

    def crash_on_latest(src, dst):
        if Path(dst).name == LATEST_FILE:
            raise OSError("power cut")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_latest)
    with pytest.raises(OSError, match="power cut"):
        save(tmp_path, 2, keep=1)
    monkeypatch.undo()

    assert latest_checkpoint(tmp_path).name == "step-000001"
    model, optimizer, _ = fresh("adamw", 5)
    assert load_training_checkpoint(tmp_path, model=model, optimizer=optimizer)["step"] == 1
    assert torch.equal(model.unembedding.weight, first.unembedding.weight)


@pytest.mark.parametrize("where", ["files", "folder rename"])
def test_crash_before_the_folder_is_complete_leaves_no_trace(tmp_path, monkeypatch, where):
    save(tmp_path, 1)
    real_replace = os.replace

    def crash(*args, **kwargs):
        raise OSError("disk full")

    def crash_on_folder(src, dst):
        if Path(dst).name == "step-000002":
            raise OSError("disk full")
        real_replace(src, dst)

    if where == "files":
        monkeypatch.setattr(training_checkpoint, "save_tensors", crash)
    else:
        monkeypatch.setattr(os, "replace", crash_on_folder)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [LATEST_FILE, "step-000001"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # latest.json still names a whole folder: no fallback needed
        assert load_training_checkpoint(tmp_path, model=GPT(CONFIG), optimizer=None)["step"] == 1


def test_latest_pointing_to_a_missing_folder_falls_back_with_a_warning(tmp_path):
    save(tmp_path, 1)
    save(tmp_path, 2)
    (tmp_path / "checkpoints" / LATEST_FILE).write_text(json.dumps({"step": 9, "dir": "step-000009"}))
    with pytest.warns(UserWarning, match="points to 'step-000009'.*step-000002"):
        state = load_training_checkpoint(tmp_path, model=GPT(CONFIG), optimizer=None)
    assert state["step"] == 2


def test_no_checkpoint_and_missing_run_dir(tmp_path):
    model, optimizer, _ = fresh("adamw", 0)
    with pytest.raises(QkvError, match="has no training checkpoint to resume from: start a new run, or give"):
        load_training_checkpoint(tmp_path, model=model, optimizer=optimizer)
    with pytest.raises(QkvError, match="does not exist"):
        load_training_checkpoint(tmp_path / "nope", model=model, optimizer=optimizer)


def test_damaged_optimizer_file(tmp_path):
    step_dir = save(tmp_path, 1)
    data = (step_dir / OPTIMIZER_FILE).read_bytes()
    (step_dir / OPTIMIZER_FILE).write_bytes(data[: len(data) // 2])
    model, optimizer, _ = fresh("adamw", 0)
    with pytest.raises(QkvError, match=r"optimizer.safetensors in .* is damaged or truncated .*: delete"):
        load_training_checkpoint(tmp_path, model=model, optimizer=optimizer)


def test_a_different_optimizer_or_model_is_refused(tmp_path):
    save(tmp_path, 1)
    model, _, _ = fresh("adamw", 0)
    with pytest.raises(QkvError, match="saved with the AdamW optimizer but this run uses SGD"):
        load_training_checkpoint(tmp_path, model=model, optimizer=make_optimizer(model, "sgd"))
    wider = GPT(CONFIG.replace(d_model=32))
    with pytest.raises(QkvError, match="tensor embedding.token_embedding.weight .* shape"):
        load_training_checkpoint(tmp_path, model=wider, optimizer=make_optimizer(wider, "adamw"))


def test_no_pickle_anywhere_in_the_run_dir(tmp_path):
    model, optimizer, batches = fresh("adamw", 0)
    train(model, optimizer, batches, 1)
    save(tmp_path, 1, model, optimizer, generators={"batches": batches}, scaler=torch.amp.GradScaler("cpu"))
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) == 4
    for path in files:
        data = path.read_bytes()
        assert not data.startswith(b"PK\x03\x04"), path  # torch.save's zip container
        if path.suffix == ".json":
            json.loads(data)
            assert not data.startswith(b"\x80")  # pickle's protocol marker
        else:
            assert path.suffix == ".safetensors", path
            with safe_open(str(path), framework="pt") as f:  # parses as safetensors, so it is not a pickle
                assert list(f.keys())
    source = Path(training_checkpoint.__file__).read_text()
    assert "import pickle" not in source and "torch.save(" not in source and "torch.load(" not in source
