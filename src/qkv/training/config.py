"""Training hyperparameters: one dataclass, filled from defaults, a TOML file and command-line flags.

Model architecture lives in the model config (:mod:`qkv.models.config`); this holds everything about
*how* to train: data, tokenizer, batch, schedule, optimizer, evaluation, checkpoints, device. A TOML file
(read by :mod:`qkv.training.config_file`) uses the same names as the flags (``lr = 3e-3``, ``batch_size = 32``)
plus a ``[model]`` table for architecture fields (``[model] d_model = 256``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from qkv.errors import QkvError
from qkv.training.finetune_settings import check_finetune, finetune_defaults
from qkv.training.flags import FLAG_NAMES, flag_names, setting  # noqa: F401  (imported from here too)
from qkv.training.setting_types import check_type

TASKS = ("lm", "translate", "word2vec")
SCHEDULES = ("cosine", "noam", "constant", "linear")
OPTIMIZERS = ("muon", "adamw", "sgd")


def _kinds(role: str) -> tuple[str, ...]:
    """The model families (:mod:`qkv.models.family`) whose models are ``role``, in the family table's order."""
    from qkv.models.family import families

    return tuple(name for name, family in families().items() if family.role == role)


TASK_ARCHS: dict[str, tuple[str, ...]] = {
    "lm": _kinds("language model"),  # gpt, llama
    "translate": _kinds("translator"),  # transformer, rnnsearch
    "word2vec": ("skipgram", "cbow"),
}
"""The values --arch takes for each task: a kind of model (a model config's ``kind``, from the family table)
or, for word2vec, its training objective. word2vec defaults to the first; lm and translate to the kind their
preset describes (a preset of another kind than --arch is refused)."""
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
COMPILE = ("auto", "on", "off")
STRATEGIES = ("ddp", "fsdp")
WARMUP_STEPS = 100
"""The default warmup; a run of fewer steps gets a tenth of its steps instead (:func:`scaled_warmup`)."""


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class TrainConfig:
    """How to train. Every field is also a ``qkv train`` flag (underscores become dashes)."""

    task: str = "lm"
    data: str | None = None  # text file, folder of .txt, a known corpus name; None: the built-in corpus
    out_dir: str | None = None  # run directory; default runs/<task>-<time>
    preset: str = "gpt-micro"
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the preset's architecture fields
    tokenizer: str = "char"  # char | word | bpe
    vocab_size: int | None = None  # for word/bpe tokenizers
    shared_vocab: bool = True  # translation: one tokenizer for source and target
    val_data: str | None = None  # translation: validation pairs (TSV or SRC,TGT); default: split off the data
    arch: str | None = None  # TASK_ARCHS; None: the task's default
    # fine-tuning a pretrained model (qkv.training.finetune_settings)
    init_from: str | None = None  # a run, a Hugging Face folder or a GGUF file: its weights, shape and tokenizer
    lora: int = 0  # LoRA's rank r: freeze the model, train adapters of rank r (0: train every weight)
    lora_alpha: float | None = None  # the adapters' update is scaled by alpha / r; default 2 r
    lora_dropout: float = 0.0  # dropout on the adapters' input
    lora_targets: str | None = None  # PEFT's names, comma-separated (q_proj,v_proj), or all; default: the family's
    quantize_base: str | None = None  # int8: LoRA over the frozen base in int8 (a quarter of its float memory)
    base_group_size: int | None = None  # that base's scales: one per this many weights (0: per row); run records it
    seq_len: int | None = None  # tokens per training sequence; default: the context (with --from: at most 256)
    # word2vec
    window: int = 5  # word2vec: context words on each side (a random reduced window 1..window per word)
    negative: int = 5  # word2vec: negative words per row
    min_count: int = 5  # word2vec: words seen fewer times are dropped from the vocabulary and the text
    sample: float = 1e-3  # word2vec: frequent-word subsampling threshold (0: keep every word)
    epochs: int | None = None  # word2vec: passes over the corpus; when given, sets --steps
    text_field: str = "text"  # the text field of JSON lines, Parquet and Hugging Face datasets
    tokenizer_sample: float = 100.0  # MB of text the tokenizer trains on, spread over a larger corpus
    # batches and schedule
    steps: int = 1300  # the main job (`qkv train`, no flags): about two minutes on 2 CPU cores
    batch_size: int = 12  # sequences per micro-batch (word2vec: words per step)
    max_tokens: int | None = None  # translation: batch by a token budget instead of a sentence count
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr: float | None = None  # end of the cosine decay; default lr / 10
    warmup_steps: int = WARMUP_STEPS  # fitted to a short run: a tenth of steps when it would not fit
    schedule: str = "cosine"
    optimizer: str = "muon"  # muon (Muon for the blocks' matrices + AdamW) or adamw
    muon_lr: float = 0.02  # Muon's peak learning rate (``lr`` is AdamW's)
    muon_ns_steps: int = 5  # Newton-Schulz iterations per Muon update (fewer: cheaper, rougher)
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    label_smoothing: float = 0.0
    max_time: float | None = None  # minutes: stop (evaluated, checkpointed) unless --steps comes first
    # evaluation, logging, checkpoints
    val_fraction: float = 0.1
    eval_interval: int = 250
    eval_batches: int = 50
    early_stop: int = 0  # stop after this many evaluations without improvement (0: never)
    bleu_sentences: int = 500  # translation: validation sentences decoded for BLEU at each evaluation
    eval_beam: int = 1  # translation: beam size used for those decodings
    log_interval: int = 10
    checkpoint_interval: int | None = None  # default: every evaluation
    keep_checkpoints: int = 2
    # machine
    seed: int = 1337
    device: str = "auto"
    precision: str = "auto"
    threads: int | None = None  # CPU threads for torch; default: the cores other processes leave idle
    compile: str = "auto"  # torch.compile the model: auto (on for CUDA, off elsewhere), on or off
    strategy: str = "ddp"  # under torchrun: ddp (a whole copy per process) or fsdp (each process holds a shard)

    @classmethod
    def create(cls, **settings: Any) -> TrainConfig:
        """Defaults, then the task's own defaults (:data:`TASK_DEFAULTS`), then its architecture's
        (:func:`arch_defaults`), then the tokenizer of a prepared folder given as ``data`` (so ``qkv train
        --data DIR`` needs no --tokenizer), then ``settings``."""
        task = settings.get("task", cls.task)
        defaults = {**TASK_DEFAULTS.get(task, {}), **arch_defaults(task, settings.get("arch"))}
        if "steps" in settings:  # an explicit --steps wins over the task's default number of epochs
            defaults.pop("epochs", None)
        defaults.update(finetune_defaults(settings))
        if task == "lm" and "tokenizer" not in settings and not settings.get("init_from"):
            from qkv.data.shards import prepared_tokenizer_settings

            defaults.update(prepared_tokenizer_settings(settings.get("data")))
        merged = {**defaults, **settings}
        if "warmup_steps" not in settings and merged.get("schedule", cls.schedule) != "noam":
            steps = merged.get("steps", cls.steps)
            if isinstance(steps, int) and not isinstance(steps, bool):
                merged["warmup_steps"] = scaled_warmup(steps, merged.get("warmup_steps", cls.warmup_steps))
        return cls.from_dict(merged)

    def __post_init__(self) -> None:
        if self.min_lr is None:
            self.min_lr = self.lr / 10
        if self.checkpoint_interval is None:
            self.checkpoint_interval = self.eval_interval
        if isinstance(self.compile, bool):  # TOML's `compile = true`
            self.compile = "on" if self.compile else "off"
        if self.warmup_steps == WARMUP_STEPS and self.schedule != "noam" and _whole(self.steps) and self.steps > 0:
            self.warmup_steps = scaled_warmup(self.steps, WARMUP_STEPS)  # the default, fitted to a short run
        self.validate()

    def validate(self) -> None:
        """Check values and combinations; QkvError names the setting (the flag on the command line) and the fix."""
        self._validate_choices()
        self._validate_numbers()
        self._validate_data_settings()
        self._validate_word2vec()
        self._validate_model_values()
        check_finetune(self, _DEFAULTS)

    def _validate_choices(self) -> None:
        """Each setting with named options holds one of them."""
        n = setting
        for name, choices in (
            ("task", TASKS),
            ("schedule", SCHEDULES),
            ("optimizer", OPTIMIZERS),
            ("precision", PRECISIONS),
            ("compile", COMPILE),
            ("strategy", STRATEGIES),
            ("tokenizer", ("char", "word", "bpe")),
        ):
            if getattr(self, name) not in choices:
                raise QkvError(
                    f"{n(name, getattr(self, name), bad=True)} is unknown: choose one of {', '.join(choices)}"
                )

    def _validate_numbers(self) -> None:
        """Counts are positive whole numbers; rates, fractions, betas, the seed and the limits are in range."""
        n = setting
        positive = ("steps", "batch_size", "grad_accum", "eval_interval", "eval_batches", "log_interval")
        for name in positive + ("checkpoint_interval", "keep_checkpoints", "muon_ns_steps"):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise QkvError(f"{n(name)} must be a positive whole number, got {value!r}")
        assert self.min_lr is not None  # __post_init__ sets lr / 10 for none
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise QkvError(
                f"learning rates must satisfy 0 <= {n('min_lr')} <= {n('lr')} and {n('lr')} > 0 "
                f"(got {self.min_lr}, {self.lr})"
            )
        if self.warmup_steps < 0 or (self.schedule != "noam" and self.warmup_steps >= self.steps):
            raise QkvError(
                f"{n('warmup_steps', self.warmup_steps)} must be between 0 and {n('steps')} ({self.steps}): lower it"
            )
        for name in ("val_fraction", "label_smoothing"):
            if not 0 <= getattr(self, name) < 1:
                raise QkvError(f"{n(name)} must be in [0, 1), got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise QkvError(f"{n(name)} must be in [0, 1), got {getattr(self, name)}: AdamW uses 0.9 and 0.99")
        if not self.muon_lr > 0:
            raise QkvError(f"{n('muon_lr')} must be above 0, got {self.muon_lr}: e.g. 0.02")
        if self.early_stop < 0:
            raise QkvError(
                f"{n('early_stop')} must be 0 (never) or a positive number of evaluations, got {self.early_stop}"
            )
        if not 0 <= self.seed < 2**63:
            raise QkvError(f"{n('seed')} must be a whole number between 0 and 2^63 - 1, got {self.seed}")
        if self.threads is not None and self.threads < 1:
            raise QkvError(
                f"{n('threads')} must be a positive whole number, got {self.threads}: e.g. {n('threads', 2)}"
            )
        if self.max_time is not None and not self.max_time > 0:
            raise QkvError(f"{n('max_time')} is in minutes and must be above 0, got {self.max_time}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise QkvError(f"{n('grad_clip')} and {n('weight_decay')} must not be negative")

    def _validate_data_settings(self) -> None:
        """The data, tokenizer and architecture settings fit the task and each other."""
        n = setting
        if self.task == "lm" and (self.val_data or self.max_tokens):
            raise QkvError(
                f"{n('val_data')} and {n('max_tokens')} are for {n('task', 'translate')}: drop them for a "
                "language model"
            )
        if self.bleu_sentences < 0 or self.eval_beam < 1:
            raise QkvError(f"{n('bleu_sentences')} must be >= 0 and {n('eval_beam')} >= 1")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise QkvError(f"{n('text_field')} must name a field, e.g. {n('text_field', 'text')}")
        if not self.tokenizer_sample > 0:
            raise QkvError(f"{n('tokenizer_sample')} must be above 0 MB, got {self.tokenizer_sample}: use e.g. 100")
        if self.vocab_size is not None and self.tokenizer == "char":
            raise QkvError(
                f"{n('vocab_size')} applies to word and bpe tokenizers: drop it or add {n('tokenizer', 'bpe')}"
            )
        if self.arch is not None and self.arch not in TASK_ARCHS.get(self.task, ()):
            archs = TASK_ARCHS.get(self.task)
            raise QkvError(
                f"{n('arch', self.arch, bad=True)} is not an architecture of {n('task', self.task)}: choose one of "
                f"{', '.join(archs)}"
                if archs
                else f"{n('arch', self.arch, bad=True)}: {n('task', self.task)} trains one kind of model: "
                f"drop {n('arch')}"
            )
        vocab = sorted(set(self.model) & {"vocab_size", "src_vocab_size", "tgt_vocab_size"})
        if vocab:
            raise QkvError(
                f"[model] {vocab[0]} comes from the tokenizer trained on the data: drop it (for word and bpe "
                f"tokenizers, set {n('vocab_size')} instead)"
            )

    def _validate_model_values(self) -> None:
        """The [model] overrides make a valid config of the preset's family (``rope_base`` 0 or inf, ``n_kv_heads``
        that does not divide ``n_heads``): refused when the settings are made, not when the loss turns NaN."""
        from qkv.models.family import family_of
        from qkv.models.presets import PRESETS

        if not self.model or self.task == "word2vec" or self.preset not in PRESETS:
            return
        cls, fields_ = PRESETS[self.preset]
        known = {f.name for f in fields(cls)}
        overrides = {k: v for k, v in self.model.items() if k in known}  # unknown names: check_arch names them
        vocabularies = dict.fromkeys(family_of(cls).vocab_fields, 2)  # set by the tokenizer; any size will do here
        cls(**{**fields_, **overrides, **vocabularies})

    def _validate_word2vec(self) -> None:
        n = setting
        names = ("window", "negative", "min_count", "sample", "epochs")
        if self.task != "word2vec":
            given = [name for name in names if getattr(self, name) != _DEFAULTS[name]]
            if given:
                flags = ", ".join(n(name) for name in given)
                raise QkvError(f"{flags} are for {n('task', 'word2vec')}: drop them for {n('task', self.task)}")
            return
        for name in ("window", "negative", "min_count") + (("epochs",) if self.epochs is not None else ()):
            value = getattr(self, name)
            if not _whole(value) or value < 1:
                raise QkvError(f"{n(name)} must be a positive whole number, got {value!r}")
        if not 0 <= self.sample < 1:
            raise QkvError(f"{n('sample')} must be in [0, 1) (word2vec uses 1e-3 to 1e-5), got {self.sample}")
        if self.tokenizer != "word":
            raise QkvError(
                f"Word2Vec learns one vector per word: use {n('tokenizer', 'word')} (the default for word2vec)"
            )
        if self.compile == "on" or self.strategy == "fsdp":
            raise QkvError(
                f"Word2Vec's sparse embedding gradients run eagerly and under DDP: drop {n('compile')} and "
                f"{n('strategy', 'fsdp')}"
            )
        if self.optimizer != "sgd" or self.grad_clip > 0 or self.grad_accum != 1:
            raise QkvError(
                f"Word2Vec trains with plain SGD on sparse rows, one batch per step: use {n('optimizer', 'sgd')}, "
                f"{n('grad_clip', 0)} and {n('grad_accum', 1)} (the word2vec defaults)"
            )

    @property
    def tokens_per_step_factor(self) -> int:
        """Sequences per optimizer step per process: batch_size x grad_accum."""
        return self.batch_size * self.grad_accum

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise QkvError(f"unknown training settings {unknown}: check the spelling (see `qkv train --help`)")
        for f in fields(cls):
            if f.name in data:
                check_type(f.name, data[f.name], f.type)
        return cls(**data)

    def replace(self, **changes: Any) -> TrainConfig:
        data = self.to_dict()
        data.update(changes)
        return TrainConfig(**data)


# What differs for translation: the paper's encoder-decoder, batches of sentences, label smoothing 0.1.
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "translate": dict(
        preset="transformer-tiny",
        batch_size=64,
        lr=2e-3,  # AdamW's rate (embeddings, norms); Muon's is muon_lr
        warmup_steps=200,
        steps=1500,  # the built-in dates task: 99.65% exact match in 3.0 minutes on 2 CPU cores
        label_smoothing=0.1,
        weight_decay=0.01,
        eval_interval=500,
        eval_batches=20,
        beta2=0.98,
    ),
    # word2vec's (and gensim's) own settings: SGD from 0.025 decaying linearly to 0.0001, 5 passes.
    "word2vec": dict(
        preset="word2vec",
        tokenizer="word",
        arch="skipgram",
        batch_size=1_000,  # words per step: smaller batches stay closer to word2vec's one-row-at-a-time updates
        lr=0.025,
        min_lr=0.0001,
        schedule="linear",
        warmup_steps=0,
        optimizer="sgd",
        grad_clip=0.0,
        compile="off",  # sparse embedding gradients: torch.compile and FSDP do not take them
        epochs=5,
        eval_batches=10,
        precision="fp32",
    ),
}


_DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


def arch_defaults(task: str, arch: str | None) -> dict[str, Any]:
    """What differs for an architecture of a task (used when --preset is not given): the family's
    ``train_defaults`` (:mod:`qkv.models.family`), its default preset and the recipe it trains best with.
    Nothing for no --arch, for word2vec's objectives, or for an --arch the task does not train (refused later)."""
    if arch not in TASK_ARCHS.get(task, ()):
        return {}
    from qkv.models.family import families

    family = families().get(arch)
    return dict(family.train_defaults) if family is not None else {}


def check_arch(config: TrainConfig) -> None:
    """QkvError, before any data is read, when --arch and --preset name different kinds of model or an
    architecture flag names a field the model does not have."""
    from qkv.models.family import family_of
    from qkv.models.presets import PRESETS, check_overrides

    family = family_of(PRESETS[config.preset][0]) if config.preset in PRESETS else None
    if config.arch is not None and family is not None and family.name != config.arch:  # no --arch: the preset decides
        same = ", ".join(family_of(config.arch).presets)
        raise QkvError(
            f"--arch {config.arch} does not match --preset {config.preset}, a {family.name} model: "
            f"choose one of {same}, or drop --preset"
        )
    check_overrides(config.preset, config.model)


def scaled_warmup(steps: int, warmup: int) -> int:
    """The default warmup, fitted to a short run: a tenth of ``steps`` when the default would not fit."""
    return warmup if warmup < steps else steps // 10
