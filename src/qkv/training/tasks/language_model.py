"""Language modelling as a task: train a GPT (or a Llama-style model, ``--arch llama``) to predict token t+1
from tokens 0..t, end to end.

The loss is the cross-entropy between the model's next-token distribution at every position and the
token that actually follows: -log P(x_{t+1} | x_{<=t}), averaged over all positions of the batch (the
causal mask lets one sequence of T tokens train T predictions at once, the GPT notes).

    corpus -> prepared token shards (tokenized once, memory-mapped) -> token batches -> model -> trainer -> run

    from qkv.training import TrainConfig, train_language_model
    result = train_language_model(TrainConfig(data="input.txt", steps=500))
    print(result.run_dir, result.best)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.cache import prepared_for_training
from qkv.data.lm import TokenBatches
from qkv.data.prepare import PreparedData
from qkv.errors import QkvError
from qkv.model_dir import CONFIG_FILE, TOKENIZER_FILE
from qkv.models import GPTConfig, make_config
from qkv.models.config import BaseConfig
from qkv.models.family import LANGUAGE_MODEL, build_model, family_of
from qkv.models.memory import check_fits
from qkv.tokenizers import Tokenizer, load_tokenizer
from qkv.training.config import TASK_ARCHS, TrainConfig, check_arch
from qkv.training.launch import Prepared, run_training
from qkv.training.run import Session


def next_token_loss(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against target ids (B, T)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), label_smoothing=label_smoothing)


class LanguageModelTask:
    """Random windows of the training text; validation loss on fixed windows of the held-out text."""

    higher_is_better = False

    def __init__(
        self,
        batches: TokenBatches,
        *,
        batch_size: int,
        eval_batches: int,
        device: torch.device,
        label_smoothing: float = 0.0,
    ) -> None:
        self.batches, self.batch_size, self.eval_batches, self.device = batches, batch_size, eval_batches, device
        self.label_smoothing = label_smoothing  # the training loss only: evaluation reports the plain cross-entropy
        self.metric = "val_loss" if batches.n_val_tokens else "train_eval_loss"

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> tuple[Tensor, Tensor]:
        x, y = self.batches.train_batch(self.batch_size, rank=rank, world_size=world_size)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, int]:
        x, y = batch
        return next_token_loss(model(x), y, label_smoothing=self.label_smoothing), y.numel()

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss over ``eval_batches`` fixed windows (the same windows at every evaluation)."""
        if self.batches.n_val_tokens:
            windows = self.batches.val_batches(self.eval_batches, self.batch_size)
        else:  # no held-out text: fixed windows of the training text, reported under another name
            windows = self.batches.fixed_train_batches(self.eval_batches, self.batch_size)
        total, count = 0.0, 0
        for x, y in windows:
            x, y = x.to(self.device), y.to(self.device)
            total += next_token_loss(model(x), y).item() * y.numel()
            count += y.numel()
        return {self.metric: total / max(count, 1)}


def prepare_language_model(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Map the prepared corpus (preparing it first if needed), build the language model (the family its
    config names: a GPT, or a Llama-style model) and its batches.

    ``--data`` may be a folder written by ``qkv prepare``; anything else is prepared once into the cache
    (:mod:`qkv.data.cache`) and mapped from there by every run, resume and process. A resumed run keeps its
    own tokenizer, which must be the one the data was encoded with.
    """
    if resume_dir is None:
        check_arch(config)
    run_tokenizer = load_tokenizer(resume_dir / TOKENIZER_FILE) if resume_dir is not None else None
    data = prepared_for_training(
        config.data,
        kind=config.tokenizer,
        vocab_size=config.vocab_size,
        text_field=config.text_field,
        sample_mb=config.tokenizer_sample,
        tokenizer=run_tokenizer,
        local_rank=session.dist.local_rank,
        quiet=not getattr(say, "enabled", True),
    )
    tokenizer = data.tokenizer()
    _check_tokenizer(data, config, run_tokenizer, resume_dir)
    if resume_dir is not None:
        model_config = BaseConfig.load(resume_dir / CONFIG_FILE)
    else:
        model_config = make_config(config.preset, vocab_size=tokenizer.vocab_size, **config.model)
    if family_of(model_config).role != LANGUAGE_MODEL:
        raise QkvError(
            f"preset {config.preset!r} is {family_of(model_config).title}, not a language model: "
            f"choose a preset of a {' or '.join(TASK_ARCHS['lm'])} model (see `qkv train --help`)"
        )
    batches = TokenBatches(
        data.shards(), context_length=model_config.context_length, val_fraction=config.val_fraction, seed=config.seed
    )
    check_fits(model_config, session.device, batch_size=config.batch_size)  # before allocating anything
    model = build_model(model_config).to(session.device)  # GPTConfig -> GPT, LlamaConfig -> Llama
    task = LanguageModelTask(
        batches,
        batch_size=config.batch_size,
        eval_batches=config.eval_batches,
        device=session.device,
        label_smoothing=config.label_smoothing,
    )
    source = data.manifest["source"]
    return Prepared(
        model,
        task,
        tokenizer,
        data_info={
            "name": source["name"],
            "source": source["description"],
            "sha256": source["text_sha256"],
            "prepared": str(data.folder),
        },
        summary=[
            f"model: {type(model).__name__}, {model.num_parameters():,} parameters ({model_config.n_layers} "
            f"layers, d_model {model_config.d_model}, {_heads(model_config)}, context {model_config.context_length})",
            f"data: {source['name']}, {batches.n_train_tokens:,} training / {batches.n_val_tokens:,} validation "
            f"tokens, mapped from {data.folder}",
        ],
    )


def _heads(config: GPTConfig) -> str:
    """ "4 heads", or "4 heads sharing 2 key/value heads" under grouped-query attention."""
    if config.n_kv_heads == config.n_heads:
        return f"{config.n_heads} heads"
    return f"{config.n_heads} heads sharing {config.n_kv_heads} key/value heads"


def _check_tokenizer(
    data: PreparedData, config: TrainConfig, run_tokenizer: Tokenizer | None, run: Path | None
) -> None:
    """The run and the prepared data must agree on the tokenizer (a QkvError with the fix otherwise)."""
    held = data.manifest["tokenizer"]
    if run_tokenizer is not None:
        if data.tokenizer() != run_tokenizer:
            raise QkvError(
                f"the prepared data {data.folder} was encoded with another tokenizer than the run {run} "
                f"(its tokenizer.json): resume on the data the run started with, or prepare this data with the "
                f"run's tokenizer: qkv prepare DATA --tokenizer {run}/tokenizer.json --out NEW_FOLDER"
            )
        return
    requested = held.get("requested_vocab_size")
    if held["kind"] != config.tokenizer or (config.vocab_size is not None and config.vocab_size != requested):
        given = config.tokenizer + (f" --vocab-size {config.vocab_size}" if config.vocab_size else "")
        made = held["kind"] + (f" --vocab-size {requested}" if requested else "")
        raise QkvError(
            f"{data.folder} was prepared with --tokenizer {made}, but this run asks for --tokenizer {given}: "
            "drop --tokenizer and --vocab-size to use the prepared tokenizer, or prepare the data again"
        )


def train_language_model(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
):
    """Train (or, with ``resume``, continue training) a language model as ``config`` says; returns a
    TrainResult."""
    return run_training(config, prepare_language_model, resume=resume, quiet=quiet, on_step=on_step)
