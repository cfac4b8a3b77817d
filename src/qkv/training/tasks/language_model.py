"""Language modelling as a task: train a GPT (or a Llama-style model, ``--arch llama``) to predict token t+1
from tokens 0..t, end to end.

The loss is the cross-entropy between the model's next-token distribution at every position and the
token that actually follows: -log P(x_{t+1} | x_{<=t}), averaged over all positions of the batch (the
causal mask lets one sequence of T tokens train T predictions at once, the GPT notes).

    corpus -> prepared token shards (tokenized once, memory-mapped) -> token batches -> model -> trainer -> run

    from qkv.training import TrainConfig, train_language_model
    result = train_language_model(TrainConfig(data="input.txt", steps=500))
    print(result.run_dir, result.best)

With ``init_from`` (``qkv train --from MODEL``) the model is a pretrained one, fine-tuned whole or with LoRA
(:mod:`qkv.training.tasks.finetune`). The loss and the evaluation are :mod:`qkv.training.tasks.lm_task`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

from qkv.data.cache import prepared_for_training
from qkv.data.lm import TokenBatches
from qkv.data.prepared_folder import PreparedData
from qkv.errors import QkvError
from qkv.model_dir import CONFIG_FILE, TOKENIZER_FILE
from qkv.models import GPTConfig, make_config
from qkv.models.base import Model
from qkv.models.config import BaseConfig
from qkv.models.family import LANGUAGE_MODEL, build_model, family_of, in_role
from qkv.models.memory import check_fits
from qkv.tokenizers import Tokenizer, load_tokenizer
from qkv.training.config import TASK_ARCHS, TrainConfig, check_arch
from qkv.training.launch import Prepared, run_training
from qkv.training.run import Session
from qkv.training.tasks.finetune import prepare_finetune
from qkv.training.tasks.lm_task import LanguageModelTask, check_seq_len, next_token_loss

__all__ = ["LanguageModelTask", "next_token_loss", "prepare_language_model", "train_language_model"]


def prepare_language_model(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Map the prepared corpus (preparing it first if needed), build the language model (the family its
    config names: a GPT, or a Llama-style model) and its batches; or, with ``init_from``, open the pretrained
    model to fine-tune (:func:`~qkv.training.tasks.finetune.prepare_finetune`).

    ``--data`` may be a folder written by ``qkv prepare``; anything else is prepared once into the cache
    (:mod:`qkv.data.cache`) and mapped from there by every run, resume and process. A resumed run keeps its
    own tokenizer, which must be the one the data was encoded with.
    """
    if config.init_from:
        return prepare_finetune(config, resume_dir, session, say)
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
    model_config = _model_config(config, resume_dir, tokenizer.vocab_size)
    seq_len = check_seq_len(config.seq_len or model_config.context_length, model_config.context_length)
    batches = TokenBatches(data.shards(), context_length=seq_len, val_fraction=config.val_fraction, seed=config.seed)
    check_fits(model_config, session.device, batch_size=config.batch_size)  # before allocating anything
    model = cast(Model, build_model(model_config).to(session.device))  # GPTConfig -> GPT, LlamaConfig -> Llama
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
            f"model: {family_of(model).name}, {model.num_parameters():,} parameters ({model_config.n_layers} "
            f"layers, d_model {model_config.d_model}, {_heads(model_config)}, context {model_config.context_length})",
            f"data: {source['name']}, {batches.n_train_tokens:,} training / {batches.n_val_tokens:,} validation "
            f"tokens, mapped from {data.folder}",
        ],
    )


def _model_config(config: TrainConfig, resume_dir: Path | None, vocab_size: int) -> GPTConfig:
    """The language model's config: the resumed run's, or the preset's with the tokenizer's ``vocab_size`` and
    the architecture flags; a QkvError when the preset is not a language model's."""
    if resume_dir is not None:
        model_config = BaseConfig.load(resume_dir / CONFIG_FILE)
    else:
        model_config = make_config(config.preset, vocab_size=vocab_size, **config.model)
    if family_of(model_config).role != LANGUAGE_MODEL:
        raise QkvError(
            f"preset {config.preset!r} is {family_of(model_config).title}, not a language model: "
            f"choose a preset of a {' or '.join(TASK_ARCHS['lm'])} model (see `qkv train --help`)"
        )
    return in_role(model_config, LANGUAGE_MODEL, GPTConfig, "--task lm")  # Llama's config too: one of its kind


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
