"""Train a GPT on text, end to end: corpus -> tokenizer -> token batches -> model -> trainer -> run dir.

from qkv.training import TrainConfig, train_language_model
result = train_language_model(TrainConfig(data="input.txt", steps=500))
print(result.run_dir, result.best)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from qkv.checkpoint import TOKENIZER_FILE, save_model_dir
from qkv.data.corpus import load_corpus
from qkv.data.lm import TokenBatches
from qkv.errors import QkvError
from qkv.models import GPT, GPTConfig, make_config
from qkv.models.config import BaseConfig
from qkv.tokenizers import load_tokenizer, train_tokenizer
from qkv.training.config import TrainConfig
from qkv.training.distributed import broadcast_object, shutdown_distributed
from qkv.training.lm_task import LanguageModelTask
from qkv.training.plot import plot_losses
from qkv.training.run import (
    check_same_data,
    fingerprint,
    load_run_config,
    new_run_dir,
    save_run_config,
    start_session,
)
from qkv.training.trainer import Trainer, TrainResult


def _say(enabled: bool) -> Callable[[str], None]:
    return (lambda text: print(text, file=sys.stderr, flush=True)) if enabled else (lambda text: None)


def train_language_model(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
) -> TrainResult:
    """Train (or, with ``resume``, continue training) a GPT as ``config`` says; returns the result."""
    session = start_session(config)
    say = _say(session.dist.is_main and not quiet)
    try:
        corpus = load_corpus(config.data)
        if resume is not None:
            run_dir = Path(resume)
            _, data_info = load_run_config(run_dir)
            check_same_data(corpus.text, data_info, run_dir)
            tokenizer = load_tokenizer(run_dir / TOKENIZER_FILE)
            model_config = BaseConfig.load(run_dir / "config.json")
        else:
            say(
                f"tokenizer: training a {config.tokenizer} tokenizer on {corpus.name} ({len(corpus.text):,} characters)"
            )
            tokenizer = train_tokenizer(config.tokenizer, corpus.text, config.vocab_size)
            model_config = make_config(config.preset, vocab_size=tokenizer.vocab_size, **config.model)
        if not isinstance(model_config, GPTConfig):
            raise QkvError(
                f"preset {config.preset!r} is a {model_config.kind} model, not a language model: "
                "choose a gpt-* preset (see `qkv train --help`)"
            )
        batches = TokenBatches.from_text(
            corpus.text,
            tokenizer,
            context_length=model_config.context_length,
            val_fraction=config.val_fraction,
            seed=config.seed,
        )
        model = GPT(model_config).to(session.device)
        if resume is None:
            run_dir = new_run_dir(config.out_dir, "lm") if session.dist.is_main else None
            run_dir = Path(broadcast_object(str(run_dir), session.dist))
            if session.dist.is_main:
                save_model_dir(run_dir, model, tokenizer, weights_name=None)
                data_info = {"name": corpus.name, "source": corpus.source, "sha256": fingerprint(corpus.text)}
                save_run_config(run_dir, config, data_info)
        say(
            f"model: GPT, {model.num_parameters():,} parameters ({model_config.n_layers} layers, "
            f"d_model {model_config.d_model}, {model_config.n_heads} heads, context {model_config.context_length}); "
            f"data: {batches.n_train_tokens:,} training / {batches.n_val_tokens:,} validation tokens; "
            f"device: {session.device}" + (f" x {session.dist.world_size} processes" if session.dist.enabled else "")
        )
        say(f"run directory: {run_dir}")
        task = LanguageModelTask(
            batches, batch_size=config.batch_size, eval_batches=config.eval_batches, device=session.device
        )
        trainer = Trainer(
            model,
            task,
            config,
            run_dir,
            device=session.device,
            precision=session.precision,
            save_best=lambda m: save_model_dir(run_dir, m, tokenizer),
            dist=session.dist,
            quiet=quiet,
            on_step=on_step,
        )
        if resume is not None:
            trainer.resume()
            say(f"resuming at step {trainer.state.step} of {config.steps}")
        result = trainer.fit()
        if session.dist.is_main:
            plot_losses(run_dir)
        return result
    finally:
        shutdown_distributed()
