"""Train a GPT on text, end to end: corpus -> tokenizer -> token batches -> model -> trainer -> run dir.

from qkv.training import TrainConfig, train_language_model
result = train_language_model(TrainConfig(data="input.txt", steps=500))
print(result.run_dir, result.best)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qkv.checkpoint import CONFIG_FILE, TOKENIZER_FILE
from qkv.data.corpus import load_corpus
from qkv.data.lm import TokenBatches
from qkv.errors import QkvError
from qkv.models import GPT, GPTConfig, make_config
from qkv.models.config import BaseConfig
from qkv.tokenizers import load_tokenizer, train_tokenizer
from qkv.training.config import TrainConfig
from qkv.training.launch import Prepared, run_training
from qkv.training.lm_task import LanguageModelTask
from qkv.training.run import Session, fingerprint


def prepare_language_model(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Read the corpus, train (or reload) the tokenizer, build the GPT and its batches."""
    corpus = load_corpus(config.data)
    if resume_dir is not None:
        tokenizer = load_tokenizer(resume_dir / TOKENIZER_FILE)
        model_config = BaseConfig.load(resume_dir / CONFIG_FILE)
    else:
        say(f"tokenizer: training a {config.tokenizer} tokenizer on {corpus.name} ({len(corpus.text):,} characters)")
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
    task = LanguageModelTask(
        batches, batch_size=config.batch_size, eval_batches=config.eval_batches, device=session.device
    )
    return Prepared(
        model,
        task,
        tokenizer,
        data_info={"name": corpus.name, "source": corpus.source, "sha256": fingerprint(corpus.text)},
        summary=[
            f"model: GPT, {model.num_parameters():,} parameters ({model_config.n_layers} layers, d_model "
            f"{model_config.d_model}, {model_config.n_heads} heads, context {model_config.context_length})",
            f"data: {corpus.name}, {batches.n_train_tokens:,} training / {batches.n_val_tokens:,} validation tokens",
        ],
    )


def train_language_model(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
):
    """Train (or, with ``resume``, continue training) a GPT as ``config`` says; returns a TrainResult."""
    return run_training(config, prepare_language_model, resume=resume, quiet=quiet, on_step=on_step)
