"""Train an encoder-decoder translator end to end, with the same trainer as the language models.

Data: a TSV file (source<TAB>target per line) or two line-aligned files given as ``SRC_FILE,TGT_FILE``;
with no data, the built-in task: human-written dates in English and French to ISO dates. Tokenizers: one
shared vocabulary for both sides (default; then source, target and output embeddings are one matrix, as
in the paper) or one per side (``--shared-vocab false``).

    from qkv.training import TrainConfig, train_translator
    result = train_translator(TrainConfig.create(task="translate"))   # the dates task
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from qkv.checkpoint import CONFIG_FILE, TARGET_TOKENIZER_FILE, TOKENIZER_FILE
from qkv.data.dates import date_pairs, held_out_pairs
from qkv.data.parallel import ParallelCorpus, load_parallel, split_parallel
from qkv.data.translation import TranslationBatches
from qkv.errors import QkvError
from qkv.models import Transformer, TransformerConfig, make_config
from qkv.models.config import BaseConfig
from qkv.tokenizers import Tokenizer, load_tokenizer, train_tokenizer
from qkv.training.config import TrainConfig
from qkv.training.launch import Prepared, run_training
from qkv.training.run import Session, fingerprint
from qkv.training.translation_task import TranslationTask

DATES_TRAIN_PAIRS = 60_000
DATES_VAL_PAIRS = 1_000


def parallel_source(spec: str) -> str | tuple[str, str]:
    """``pairs.tsv`` stays a path; ``train.en,train.de`` becomes the pair of line-aligned files."""
    if "," in spec:
        src, _, tgt = spec.partition(",")
        return src, tgt
    return spec


def load_translation_data(config: TrainConfig) -> tuple[ParallelCorpus, ParallelCorpus, str]:
    """Training and validation pairs, and the kind of task ("dates" or "parallel")."""
    if config.data is None or config.data == "dates":
        train = date_pairs(DATES_TRAIN_PAIRS, seed=config.seed)
        return train, held_out_pairs(DATES_VAL_PAIRS, seed=config.seed, exclude=set(train.sources)), "dates"
    corpus = load_parallel(parallel_source(config.data))
    if config.val_data:
        return corpus, load_parallel(parallel_source(config.val_data)), "parallel"
    if config.val_fraction <= 0:
        raise QkvError("translation needs validation pairs: give --val-data or a --val-fraction above 0")
    train, val = split_parallel(corpus, config.val_fraction, config.seed)
    return train, val, "parallel"


def _train_tokenizers(config: TrainConfig, train: ParallelCorpus) -> tuple[Tokenizer, Tokenizer | None]:
    if config.shared_vocab:
        return train_tokenizer(config.tokenizer, train.sources + train.targets, config.vocab_size), None
    return (
        train_tokenizer(config.tokenizer, train.sources, config.vocab_size),
        train_tokenizer(config.tokenizer, train.targets, config.vocab_size),
    )


def prepare_translator(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Load the pairs, train (or reload) the tokenizers, build the Transformer and its batches."""
    train, val, kind = load_translation_data(config)
    if resume_dir is not None:
        source_tok = load_tokenizer(resume_dir / TOKENIZER_FILE)
        target_file = resume_dir / TARGET_TOKENIZER_FILE
        target_tok = load_tokenizer(target_file) if target_file.exists() else None
        model_config = BaseConfig.load(resume_dir / CONFIG_FILE)
    else:
        say(
            f"tokenizers: training {'a shared' if config.shared_vocab else 'a source and a target'} "
            f"{config.tokenizer} vocabulary on {len(train):,} pairs"
        )
        source_tok, target_tok = _train_tokenizers(config, train)
        overrides = dict(config.model)
        target_size = (target_tok or source_tok).vocab_size
        model_config = make_config(
            config.preset,
            src_vocab_size=source_tok.vocab_size,
            tgt_vocab_size=target_size,
            share_embeddings=target_tok is None,
            **overrides,
        )
    if not isinstance(model_config, TransformerConfig):
        raise QkvError(
            f"preset {config.preset!r} is a {model_config.kind} model, not an encoder-decoder: "
            "choose a transformer-* preset for --task translate"
        )
    sizes = dict(batch_size=None if config.max_tokens else config.batch_size, max_tokens=config.max_tokens)
    batches = TranslationBatches.from_corpus(
        train, source_tok, target_tok, max_len=model_config.max_len, seed=config.seed, **sizes
    )
    val_batches = TranslationBatches.from_corpus(val, source_tok, target_tok, max_len=model_config.max_len, **sizes)
    if batches.n_cropped:
        say(
            f"warning: {batches.n_cropped} training pairs were longer than max_len={model_config.max_len} tokens "
            "and were cropped (raise --max-len to keep them whole)"
        )
    model = Transformer(model_config).to(session.device)
    task = TranslationTask(
        batches,
        val_batches,
        val.targets,
        target_tok or source_tok,
        device=session.device,
        label_smoothing=config.label_smoothing,
        eval_batches=config.eval_batches,
        bleu_sentences=config.bleu_sentences,
        eval_beam=config.eval_beam,
        metric="exact_match" if kind == "dates" else "bleu",
    )
    text = "\n".join(s + "\t" + t for s, t in zip(train.sources, train.targets, strict=True))
    return Prepared(
        model,
        task,
        source_tok,
        target_tok,
        data_info={"name": train.name, "source": train.source, "sha256": fingerprint(text)},
        summary=[
            f"model: encoder-decoder Transformer, {model.num_parameters():,} parameters "
            f"({model_config.n_encoder_layers}+{model_config.n_decoder_layers} layers, d_model "
            f"{model_config.d_model}, {model_config.n_heads} heads)",
            f"data: {train.name}, {len(train):,} training / {len(val):,} validation pairs "
            f"({batches.n_batches:,} batches per epoch)",
        ],
    )


def train_translator(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
):
    """Train (or, with ``resume``, continue training) a translator as ``config`` says; returns a TrainResult."""
    return run_training(config, prepare_translator, resume=resume, quiet=quiet, on_step=on_step)
