"""Word2Vec as a task: learn word vectors (W_E) with skip-gram or CBOW and negative sampling.

The same trainer, run directory, checkpoints and progress bar as the Transformer tasks; what differs is
the data (rows of :mod:`qkv.data.word2vec`), the loss (:class:`~qkv.models.word2vec.Word2Vec`) and the
defaults (:data:`~qkv.training.config.TASK_DEFAULTS`): word2vec's plain SGD at learning rate 0.025,
decaying linearly to 0.0001 over the run, 1,000 words per step, 5 passes over the corpus. A step's
loss is reported per row (the mean), but its gradient is that of the sum over rows, so every row moves
the weights by lr x its own gradient, as one word2vec update does.

    from qkv.training import TrainConfig, train_word2vec
    result = train_word2vec(TrainConfig.create(task="word2vec", data="corpus.txt"))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from qkv.data.corpus import load_corpus
from qkv.data.prepared_folder import PreparedData
from qkv.data.shards import is_prepared, read_manifest
from qkv.data.word2vec import (
    Word2VecBatches,
    prepared_vocabulary,
    remap_stream,
    split_lines,
    word_counts,
    word_stream,
)
from qkv.errors import QkvError
from qkv.model_dir import CONFIG_FILE, TOKENIZER_FILE
from qkv.models.config import ModelConfig
from qkv.models.family import WORD_VECTORS, family_of, in_role
from qkv.models.memory import check_fits
from qkv.models.presets import make_config
from qkv.models.word2vec import Word2Vec, Word2VecBatch, Word2VecConfig
from qkv.tokenizers import Tokenizer, WordTokenizer, load_tokenizer
from qkv.tokenizers.base import SPECIAL_TOKENS
from qkv.tokenizers.word import WORD_PATTERN
from qkv.training.config import TrainConfig
from qkv.training.launch import Prepared, run_training
from qkv.training.run import Session, fingerprint
from qkv.training.schedule import learning_rate

MIN_WORDS = 2
"""The fewest distinct words Word2Vec can train on (a word and at least one other to tell it from)."""


class Word2VecTask:
    """Rows from the corpus in order, pass after pass; evaluation: the mean loss on fixed rows."""

    metric = "eval_loss"
    higher_is_better = False

    def __init__(
        self,
        batches: Word2VecBatches,
        *,
        eval_batches: int,
        device: torch.device,
        step_size: Callable[[int], float] | None = None,
    ) -> None:
        self.batches, self.eval_batches, self.device = batches, eval_batches, device
        self.step_size = step_size  # the learning rate at a step (the trainer's schedule), for the damping
        self._fixed: list[Word2VecBatch] | None = None

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> Word2VecBatch:
        return self.batches.train_batch(rank, world_size).to(self.device)

    def loss(self, model: nn.Module, batch: Word2VecBatch) -> tuple[Tensor, int]:
        """The mean loss per row, whose gradient is that of the summed loss (one SGD update per row)."""
        lr = self.step_size(self.batches.position - 1) if self.step_size is not None else None
        total = _word2vec(model).loss(batch, lr=lr)
        mean = total / max(batch.n_rows, 1)
        return total + (mean - total).detach(), batch.n_words

    def update(self, model: nn.Module, batch: Word2VecBatch) -> tuple[Tensor, int]:
        """One SGD step with the gradient written out (:meth:`Word2Vec.sgd_step`, equal to ``loss`` and SGD);
        the mean loss per row and the corpus words."""
        if self.step_size is None:
            raise ValueError("Word2VecTask.update needs step_size: the learning rate at each step")
        if batch.n_rows == 0:  # every word of the batch subsampled away (a tiny corpus): nothing to update
            return torch.zeros((), device=self.device), batch.n_words
        total = _word2vec(model).sgd_step(batch, self.step_size(self.batches.position - 1))
        return total / max(batch.n_rows, 1), batch.n_words

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        if self._fixed is None:
            self._fixed = self.batches.eval_batches(self.eval_batches)
        total, rows, word2vec = 0.0, 0, _word2vec(model)
        for batch in self._fixed:
            total += float(word2vec.loss(batch.to(self.device)))
            rows += batch.n_rows
        return {self.metric: total / max(rows, 1)}


def train_vocabulary(lines: list[str], config: TrainConfig) -> WordTokenizer:
    """The words seen at least ``--min-count`` times, most frequent first (at most ``--vocab-size`` ids)."""
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(WORD_PATTERN.findall(line))
    frequent = sum(1 for count in counts.values() if count >= config.min_count)
    if frequent < MIN_WORDS:
        raise QkvError(
            f"only {frequent} distinct word(s) of the corpus occur at least --min-count={config.min_count} times "
            f"(of {len(counts)} distinct words): Word2Vec needs at least {MIN_WORDS}; lower --min-count or give "
            "a larger corpus"
        )
    return WordTokenizer.train(lines, vocab_size=config.vocab_size, min_freq=config.min_count)


def _word2vec(model: nn.Module) -> Word2Vec:
    """The model the task trains, as its family's description says it is one of the word-vectors role's."""
    return in_role(model, WORD_VECTORS, Word2Vec, "the word2vec task")


def word2vec_config(config: TrainConfig, vocab_size: int) -> Word2VecConfig:
    """The preset (``word2vec``, d_model 100) with the vocabulary size and ``--d-model``/``--dim``."""
    other = sorted(set(config.model) - {"d_model"})
    if other:
        flags = ", ".join("--" + name.replace("_", "-") for name in other)
        raise QkvError(f"Word2Vec has one size setting, --d-model (--dim): drop {flags}")
    model_config = make_config(config.preset, vocab_size=vocab_size, **config.model)
    if family_of(model_config).role != WORD_VECTORS:
        raise QkvError(f"preset {config.preset!r} is {family_of(model_config).title}: use --preset word2vec")
    return in_role(model_config, WORD_VECTORS, Word2VecConfig, "--task word2vec")


def text_words(
    config: TrainConfig, run_tokenizer: Tokenizer | None, say: Callable[[str], None]
) -> tuple[Tokenizer, np.ndarray, dict]:
    """A text corpus: each line a sentence; the vocabulary made from it (or the resumed run's)."""
    corpus = load_corpus(config.data, text_field=config.text_field)
    lines = list(split_lines(corpus.text))
    tokenizer = run_tokenizer
    if tokenizer is None:
        say(f"vocabulary: words seen at least {config.min_count} times in {corpus.name} ({len(lines):,} lines)")
        tokenizer = train_vocabulary(lines, config)
    info = {"name": corpus.name, "source": corpus.source, "sha256": fingerprint(corpus.text)}
    return tokenizer, word_stream(lines, tokenizer), info


def prepared_words(
    config: TrainConfig, run_tokenizer: Tokenizer | None, say: Callable[[str], None]
) -> tuple[Tokenizer, np.ndarray, dict]:
    """A folder written by ``qkv prepare --tokenizer word``: its ids, mapped onto the words seen at least
    ``--min-count`` times (or the resumed run's vocabulary). The shards keep no line breaks, so the whole
    corpus is one sentence: windows run across lines (as on text8)."""
    assert config.data is not None  # is_prepared(config.data) chose this reader
    data = PreparedData(Path(config.data), read_manifest(config.data))
    kind = data.manifest["tokenizer"]["kind"]
    if kind != "word":
        raise QkvError(
            f"{data.folder} was prepared with --tokenizer {kind}, but Word2Vec learns one vector per word: "
            f"prepare it with --tokenizer word, or give the text itself"
        )
    prepared = data.tokenizer()
    shards = data.shards()
    ids = shards.read(0, len(shards))
    tokenizer = run_tokenizer
    if tokenizer is None:
        say(f"vocabulary: words seen at least {config.min_count} times in {data.folder} ({len(ids):,} tokens)")
        vocab = prepared_vocabulary(ids, prepared, config.min_count, config.vocab_size)
        if len(vocab) - len(SPECIAL_TOKENS) < MIN_WORDS:
            raise QkvError(
                f"only {len(vocab) - len(SPECIAL_TOKENS)} distinct word(s) of {data.folder} occur at least "
                f"--min-count={config.min_count} times: Word2Vec needs at least {MIN_WORDS}; lower --min-count "
                "or prepare a larger corpus"
            )
        tokenizer = WordTokenizer(vocab)
    source = data.manifest["source"]
    info = {"name": source["name"], "source": source["description"], "sha256": source["text_sha256"]}
    return tokenizer, remap_stream(ids, prepared, tokenizer), {**info, "prepared": str(data.folder)}


def prepare_word2vec(
    config: TrainConfig, resume_dir: Path | None, session: Session, say: Callable[[str], None]
) -> Prepared:
    """Read the corpus, build (or reload) the vocabulary, the model and the batches; with ``--epochs``,
    set ``config.steps`` to that many passes over the corpus."""
    if resume_dir is not None:
        model_config = ModelConfig.load(resume_dir / CONFIG_FILE)
        if family_of(model_config).role != WORD_VECTORS:
            raise QkvError(
                f"{resume_dir} holds {family_of(model_config).title}, not Word2Vec: resume it with its own --task"
            )
    run_tokenizer = load_tokenizer(resume_dir / TOKENIZER_FILE) if resume_dir is not None else None
    words = prepared_words if is_prepared(config.data) else text_words
    tokenizer, stream, data_info = words(config, run_tokenizer, say)
    if resume_dir is None:
        model_config = word2vec_config(config, tokenizer.vocab_size)
    separator = tokenizer.eos_id
    assert separator is not None  # a word vocabulary always holds <eos> (SPECIAL_TOKENS)
    counts = word_counts(stream, tokenizer.vocab_size, separator)
    batches = Word2VecBatches(
        stream,
        counts,
        separator=separator,
        arch=config.arch or "skipgram",
        window=config.window,
        negative=config.negative,
        sample=config.sample,
        batch_words=config.batch_size,
        seed=config.seed,
    )
    if config.epochs is not None:
        config.steps = config.epochs * -(-batches.n_chunks // session.dist.world_size)
    check_fits(model_config, session.device)  # before allocating anything
    model = Word2Vec(model_config).to(session.device)

    step_size = step_sizes(config, model_config.d_model)
    task = Word2VecTask(batches, eval_batches=config.eval_batches, device=session.device, step_size=step_size)
    vocabulary = int((counts > 0).sum())
    return Prepared(
        model,
        task,
        tokenizer,
        data_info=data_info,
        summary=[
            f"model: Word2Vec {batches.arch}, {model.num_parameters():,} parameters ({vocabulary:,} words x "
            f"d_model {model_config.d_model}, input and output vectors)",
            f"data: {data_info['name']}, {batches.n_words:,} words; window {config.window}, "
            f"{config.negative} negatives, "
            f"sample {config.sample:g}; {config.steps:,} steps of {config.batch_size:,} words"
            + (f" ({config.epochs} epochs)" if config.epochs is not None else ""),
        ],
    )


def step_sizes(config: TrainConfig, d_model: int) -> Callable[[int], float]:
    """The learning rate at each step (``config.steps`` as they stand now: after ``--epochs`` set them), for the
    SGD step the task writes out."""
    min_lr = config.min_lr
    assert min_lr is not None  # TrainConfig.__post_init__ sets lr / 10 for none

    def step_size(step: int) -> float:
        return learning_rate(
            step,
            schedule=config.schedule,
            lr=config.lr,
            min_lr=min_lr,
            warmup=config.warmup_steps,
            total=config.steps,
            d_model=d_model,
        )

    return step_size


def train_word2vec(
    config: TrainConfig,
    *,
    resume: str | Path | None = None,
    quiet: bool = False,
    on_step: Callable | None = None,
):
    """Train (or, with ``resume``, continue training) Word2Vec as ``config`` says; returns a TrainResult."""
    return run_training(config, prepare_word2vec, resume=resume, quiet=quiet, on_step=on_step)


def unigram_counts(stream: np.ndarray, tokenizer: Tokenizer) -> dict[str, int]:
    """Each vocabulary word's count in ``stream`` (for checks against other tools)."""
    assert tokenizer.eos_id is not None  # a word vocabulary always holds <eos> (SPECIAL_TOKENS)
    counts = word_counts(stream, tokenizer.vocab_size, tokenizer.eos_id)
    return {tokenizer.id_to_token(i): int(c) for i, c in enumerate(counts) if c > 0}
