"""Train a model. With no arguments: a small character-level GPT on the built-in corpus (the English text
of Python's documentation), 1,300 steps (about 4 minutes on two busy CPU cores), then samples at two temperatures.

Settings come from the defaults, then a TOML file (--config), then the flags; `--resume RUN_DIR`
continues a run exactly where it stopped (flags given with it, such as --steps, override the saved ones).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from typing import Any

from qkv.cli.options import add_alias, is_main_process, minutes, note
from qkv.cli.train_report import best_score, next_commands, print_neighbours, print_samples, print_translations
from qkv.errors import QkvError
from qkv.models.family import LANGUAGE_MODEL, families
from qkv.training.config import FLAG_NAMES, TASK_ARCHS, TrainConfig, flag_names
from qkv.training.config_file import read_toml

LM_PRESETS = [name for family in families().values() if family.role == LANGUAGE_MODEL for name in family.presets]

TRAIN_HELP = {
    "task": "lm (a GPT language model), translate (an encoder-decoder) or word2vec (word vectors)",
    "data": "a text, .jsonl, .parquet or compressed file, a folder, a glob, hf:DATASET, a folder written by "
    "`qkv prepare`, or a corpus name (pydoc: built in; tinyshakespeare: downloaded)",
    "out_dir": "the run directory to write (default runs/<task>-<date>-<time>; old name: --out-dir)",
    "preset": f"model size: {', '.join(LM_PRESETS)} (translate: transformer-*, rnnsearch-*)",
    "arch": f"lm: {' or '.join(TASK_ARCHS['lm'])} (llama: RMSNorm, SwiGLU, RoPE and grouped-query attention; "
    "preset llama-micro unless --preset is given); translate: transformer (the default) or rnnsearch (Bahdanau "
    "et al. 2015: GRUs with additive attention; preset rnnsearch-small unless --preset is given); word2vec: "
    "skipgram (a word predicts its neighbours, the default) or cbow (they predict it)",
    "init_from": "fine-tune this model instead of starting from random weights: a run, a Hugging Face folder or a "
    ".gguf file (its architecture, tokenizer and chat template are kept)",
    "lora": "with --from: freeze the model and train LoRA adapters of this rank (0: fine-tune every weight)",
    "lora_alpha": "LoRA: the adapters' update is scaled by alpha / rank (default 2 x rank)",
    "lora_dropout": "LoRA: dropout on the adapters' input",
    "lora_targets": "LoRA: the projections to adapt, by PEFT's names, comma-separated (llama: q_proj, k_proj, "
    "v_proj, o_proj, gate_proj, up_proj, down_proj; gpt: c_attn, attn.c_proj, c_fc, mlp.c_proj), or all "
    "(default: q_proj,v_proj; gpt: c_attn)",
    "quantize_base": "LoRA: hold the frozen base in int8 (a quarter of its float memory, as QLoRA)",
    "base_group_size": "with --quantize-base: a scale per this many weights, or 0 for one per row (default: 32 "
    "where every layer's width allows; the run records the one it used)",
    "seq_len": "tokens per training sequence (default: the model's context; with --from at most 256)",
    "tokenizer": "char, word or bpe (trained on the data)",
    "vocab_size": "vocabulary size for word/bpe tokenizers",
    "text_field": "the text field of JSON lines, Parquet files and Hugging Face datasets",
    "tokenizer_sample": "MB of text the tokenizer trains on (spread evenly over a larger corpus)",
    "steps": "optimizer steps",
    "batch_size": "sequences per micro-batch (per process)",
    "grad_accum": "micro-batches per optimizer step (gradient accumulation)",
    "lr": "peak learning rate (with --schedule noam: a factor on the paper's formula)",
    "min_lr": "final learning rate of the cosine schedule (default lr/10)",
    "warmup_steps": "linear warmup steps",
    "schedule": "cosine (warmup + cosine decay), noam (the paper's inverse square root) or constant",
    "optimizer": "muon (orthogonalised updates for the blocks' matrices, AdamW for the rest) or adamw",
    "muon_lr": "Muon's peak learning rate (--lr is AdamW's)",
    "muon_ns_steps": "Newton-Schulz iterations per Muon update",
    "weight_decay": "AdamW weight decay (matrices only)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the gradient norm to this (0: off)",
    "label_smoothing": "label smoothing of the loss (a regulariser for language models and translators alike)",
    "max_time": "stop after this long: 30s, 10m, 2h (a bare number is minutes), with an evaluation and a "
    "checkpoint, if --steps has not come first; the schedule still spans --steps",
    "shared_vocab": "translate: one tokenizer for source and target (false: one each)",
    "bleu_sentences": "translate: validation sentences decoded for BLEU at each evaluation (0: pick the best model "
    "by validation loss)",
    "eval_beam": "translate: beam size of those decodings",
    "val_data": "translate: validation pairs (a TSV file or SRC,TGT files; default: split off the data)",
    "max_tokens": "translate: batch by a budget of tokens per batch instead of a sentence count (old name: "
    "--max-tokens)",
    "val_fraction": "fraction of the text held out for validation (the end of the text)",
    "eval_interval": "evaluate every N steps",
    "eval_batches": "batches per evaluation",
    "early_stop": "stop after N evaluations without improvement (0: never)",
    "log_interval": "log metrics every N steps",
    "checkpoint_interval": "save a resumable checkpoint every N steps (default: every evaluation)",
    "keep_checkpoints": "how many resumable checkpoints to keep",
    "seed": "random seed (same seed, same run)",
    "device": "auto, cpu, cuda, cuda:N or mps",
    "precision": "auto (bf16/fp16 autocast on GPUs, fp32 on CPU), fp32, bf16 or fp16",
    "threads": "CPU threads (default: the cores other processes leave idle)",
    "window": "word2vec: context words on each side (a random reduced window of 1..N per word)",
    "negative": "word2vec: negative words drawn per row (unigram^0.75)",
    "min_count": "word2vec: drop words seen fewer times",
    "sample": "word2vec: subsampling threshold for frequent words (0: off)",
    "epochs": "word2vec: passes over the corpus (sets --steps; word2vec default 5)",
    "compile": "torch.compile the model: --compile alone means on; auto turns it on for CUDA only (on the CPU "
    "it made training slower, see docs/training.md)",
    "strategy": "under torchrun: ddp (every process a whole copy) or fsdp (every process a shard of the weights, "
    "gradients and optimizer state, for models that do not fit one device)",
}

# What a flag's value is called in the help where the field's name would not say it.
METAVARS = {"init_from": "MODEL", "lora": "RANK", "lora_targets": "NAMES", "quantize_base": "int8"}

# Settings that choose the model a run trains: a resumed run keeps them.
MODEL_SETTINGS = ("init_from", "lora", "lora_alpha", "lora_targets", "quantize_base", "base_group_size")

# Flags read by their own function: durations take units.
FLAG_CONVERT = {"max_time": minutes}

# Flags that may be given bare: `--compile` means `--compile on`.
FLAG_CONSTS = {"compile": "on"}

# Settings whose default is None, so their type cannot be read off the default.
FLAG_TYPES = {
    "data": str,
    "init_from": str,
    "lora_alpha": float,
    "lora_targets": str,
    "quantize_base": str,
    "base_group_size": int,
    "seq_len": int,
    "out_dir": str,
    "arch": str,
    "vocab_size": int,
    "min_lr": float,
    "max_time": float,
    "val_data": str,
    "max_tokens": int,
    "checkpoint_interval": int,
    "threads": int,
    "epochs": int,
}

# Architecture flags: they override fields of the preset's model config.
MODEL_FLAGS: dict[str, tuple[type, str]] = {
    "n_layers": (int, "number of blocks N"),
    "d_model": (int, "width of every token vector"),
    "n_heads": (int, "attention heads h (must divide d_model)"),
    "n_kv_heads": (int, "key/value heads (must divide n_heads; fewer: grouped-query attention, 1: multi-query)"),
    "d_ff": (int, "hidden width of the feed-forward network (default 4 d_model; llama: 8/3 d_model)"),
    "context_length": (int, "longest sequence the model sees (a GPT's context, a translator's longest sentence)"),
    "dropout": (float, "dropout probability"),
    "positional": (str, "rope, learned, sinusoidal or none"),
    "rope_base": (float, "base of the rotary angles (Hugging Face's rope_theta; 10000 as in RoFormer)"),
    "activation": (str, "relu, relu2 (squared ReLU), gelu, gelu_tanh or silu"),
    "norm_first": (bool, "pre-LN (true) or the paper's post-LN (false)"),
    "tie_embeddings": (bool, "share W_U with W_E"),
    "bias": (bool, "biases in linear layers and LayerNorms"),
    "d_embedding": (int, "RNNSearch: word embedding width m"),
    "d_hidden": (int, "RNNSearch: GRU state width n (each encoder direction, and the decoder)"),
    "d_attention": (int, "RNNSearch: hidden width n' of the additive alignment model"),
    "d_readout": (int, "RNNSearch: maxout units l before the output layer"),
}


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="read settings from a TOML file first")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR exactly where it stopped")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or messages")
    parser.add_argument("--no-samples", action="store_true", help="skip the samples printed after training")
    parser.add_argument("--sample-length", type=int, default=400, help="tokens per sample printed after training")
    train = parser.add_argument_group("training")
    for f in fields(TrainConfig):
        if f.name == "model":
            continue
        kind = FLAG_TYPES.get(f.name) or type(f.default)
        bare: dict[str, Any] = {"nargs": "?", "const": FLAG_CONSTS[f.name]} if f.name in FLAG_CONSTS else {}
        flag = FLAG_NAMES.get(f.name) or f"--{f.name.replace('_', '-')}"
        convert = FLAG_CONVERT.get(f.name) or (_bool if kind is bool else kind)
        train.add_argument(
            flag,
            dest=f.name,
            metavar=METAVARS.get(f.name, f.name.upper()),
            type=convert,
            default=argparse.SUPPRESS,
            **bare,
            help=TRAIN_HELP[f.name] + (f" (default {f.default})" if f.default is not None else ""),
        )
        if flag != f"--{f.name.replace('_', '-')}":  # the old spelling, for scripts written before the rename
            add_alias(train, f"--{f.name.replace('_', '-')}", of=flag, dest=f.name, type=convert)
    model = parser.add_argument_group("model (override the preset)")
    for name, (kind, text) in MODEL_FLAGS.items():
        model.add_argument(
            f"--{name.replace('_', '-')}",
            *(["--max-len"] if name == "context_length" else []),  # the translators' name before the rename
            *(["--dim"] if name == "d_model" else []),  # word2vec's name for it
            dest=f"model.{name}",
            metavar=name.upper(),
            type=_bool if kind is bool else kind,
            default=argparse.SUPPRESS,
            help=text,
        )


def config_from_args(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults <- ``base`` (saved settings of a resumed run) <- TOML file <- flags."""
    settings: dict[str, Any] = dict(base or {})
    settings["model"] = dict(settings.get("model", {}))
    if args.config:
        file_settings = read_toml(args.config)
        model = file_settings.pop("model", {})
        if not isinstance(model, dict):
            raise QkvError(f"{args.config}: model = {model!r} must be a [model] table, e.g. [model] d_model = 256")
        settings["model"].update(model)
        settings.update(file_settings)
    if "steps" in vars(args) and "epochs" not in vars(args):  # an explicit --steps replaces the epochs
        settings["epochs"] = None
    for key, value in vars(args).items():
        if key.startswith("model."):
            settings["model"][key.removeprefix("model.")] = value
        elif key in {f.name for f in fields(TrainConfig)}:
            settings[key] = value
    with flag_names():  # messages name --flags, not the Python fields
        return TrainConfig.from_dict(settings) if base else TrainConfig.create(**settings)


def run(args: argparse.Namespace) -> int:
    from qkv.training.run import load_run_config

    if args.sample_length < 1:
        raise QkvError(f"--sample-length must be at least 1 token, got {args.sample_length}")
    base = None
    if args.resume:
        saved, _ = load_run_config(args.resume)
        base = saved.to_dict()
        # A resumed run keeps its architecture; say so instead of silently ignoring such flags.
        given = [k.removeprefix("model.") for k in vars(args) if k.startswith("model.")]
        given += [k for k in MODEL_SETTINGS if k in vars(args) and vars(args)[k] != base.get(k)]
        if given:
            flags = ", ".join(FLAG_NAMES.get(g) or "--" + g.replace("_", "-") for g in given)
            raise QkvError(f"a resumed run keeps its model; drop {flags}")
        check_kept_settings(args, base)
    config = config_from_args(args, base)
    if args.resume:
        check_resume_steps(args.resume, config.steps)
        check_resume_data(config.data, given="data" in vars(args))
    elif "warmup_steps" not in vars(args) and config.warmup_steps != _default_warmup(config) and not args.quiet:
        held_note(
            f"warmup shortened to {config.warmup_steps} steps (a tenth of --steps {config.steps}) so that it "
            "fits the run; set --warmup-steps to choose"
        )
    if not args.quiet and _compiles(config):
        note("compiling the model with torch.compile: the first step takes about a minute the first time")
    if config.task == "translate":
        from qkv.training.tasks.translation import train_translator as train
    elif config.task == "word2vec":
        from qkv.training.tasks.word2vec import train_word2vec as train
    else:
        from qkv.training.tasks.language_model import train_language_model as train

    result = train(config, resume=args.resume, quiet=args.quiet)
    if not args.quiet and is_main_process():
        metric, best = best_score(result.metric, result.best)
        before = f" (before training: {result.before[result.metric]:.4f})" if result.metric in result.before else ""
        print(
            f"\n{result.stopped} at step {result.step}; best {metric} {best}{before}; run: {result.run_dir}",
            file=sys.stderr,
        )
        if result.metric == "bleu" and not result.best:
            note(f"BLEU 0: no translation shares a 4-gram with its reference yet after {result.step} steps (chrF "
                 "in metrics.jsonl shows earlier progress): train longer, e.g. a larger --max-time")  # fmt: skip
        print(next_commands(config.task, result.run_dir, result.stopped, lora=bool(config.lora)), file=sys.stderr)
    if not args.no_samples and result.stopped != "interrupted" and is_main_process():
        if config.task == "translate":
            print_translations(result.run_dir, config)
        elif config.task == "word2vec":
            print_neighbours(result.run_dir)
        else:
            print_samples(result.run_dir, length=args.sample_length)
    return 0


KEPT_ON_RESUME = ("task", "arch", "preset", "tokenizer", "vocab_size", "shared_vocab", "text_field")
"""Settings a resumed run keeps: they chose its model and its tokenizer, which the checkpoint holds."""


def check_kept_settings(args: argparse.Namespace, saved: dict[str, Any]) -> None:
    """A resume given --arch, --preset, --tokenizer, ... other than the run's: one line (they were dropped silently:
    the checkpoint holds the model and tokenizer they chose). The run's own value again is fine."""
    from qkv.models.family import family_of
    from qkv.models.presets import PRESETS
    from qkv.training.config import setting

    kept = {name: saved.get(name) for name in KEPT_ON_RESUME}
    if kept["arch"] is None and saved.get("preset") in PRESETS:  # the preset chose the architecture
        kept["arch"] = family_of(PRESETS[saved["preset"]][0]).name
    changed = [name for name in KEPT_ON_RESUME if name in vars(args) and vars(args)[name] != kept[name]]
    if changed:
        with flag_names():
            given = ", ".join(f"{setting(n, vars(args)[n])} (the run's: {kept[n]})" for n in changed)
        raise QkvError(
            f"a resumed run keeps its model and tokenizer, so {given} cannot change: drop it, or start a new run "
            "with --out"
        )


def held_note(text: str) -> None:
    """A note held (qkv.cli.held_notes) until the model and the data are checked too: a refused input stays one
    line (the pretrained model of --from is checked only once it is loaded)."""
    if is_main_process():
        print(f"note: {text}", file=sys.stderr, flush=True)


def _default_warmup(config: TrainConfig) -> int:
    from qkv.training.config import _DEFAULTS, TASK_DEFAULTS, arch_defaults
    from qkv.training.finetune_settings import finetune_defaults

    defaults = {**_DEFAULTS, **TASK_DEFAULTS.get(config.task, {}), **arch_defaults(config.task, config.arch)}
    defaults.update(finetune_defaults(config.to_dict()))
    return defaults["warmup_steps"]


def check_resume_steps(run_dir: str, steps: int) -> None:
    """Refuse a resume whose --steps is behind the checkpoint (it would resume at step 40 of 10 and stop)."""
    from qkv.training.checkpoint import latest_checkpoint, step_of

    latest = latest_checkpoint(run_dir)
    at = step_of(latest) if latest is not None else None
    if at is not None and steps < at:
        raise QkvError(f"{run_dir} is at step {at}, past --steps {steps}: give --steps above {at} to train on")


def check_resume_data(data: str | None, *, given: bool) -> None:
    """A resumed run reads its data again from the saved path; a relative one may not resolve from here."""
    from pathlib import Path

    if given or data is None or Path(data).is_absolute() or any(c in data for c in "*?[:"):
        return
    if not Path(data).exists() and ("/" in data or "." in data):
        raise QkvError(
            f"the run's data {data!r} is a relative path that does not exist from {Path.cwd()}: run from the "
            "folder the run was started in, or give its path with --data"
        )


def _compiles(config: TrainConfig) -> bool:
    """Whether training will torch.compile the model (--compile on, or auto on a GPU)."""
    from qkv.training.device import resolve_device
    from qkv.training.strategy import use_compile

    try:
        return use_compile(config.compile, resolve_device(config.device))
    except QkvError:
        return False  # a bad --device: the trainer says so
