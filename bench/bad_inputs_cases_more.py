"""The battery's cases, continued (bench/bad_inputs.py): training and resuming, permissions, killed writers, the
Python API, GGUF files, chat templates and qkv chat's stdin, quantized folders, the older verbs, and what a new
user trips on."""

from __future__ import annotations

import shutil
from pathlib import Path

from bad_inputs_cases import GEN, GEN_RUN, cli
from bad_inputs_spoil import chmod, copy, killed, pickle_bin, write

TRAIN = "train --data {text_txt} --out {tmp}/run --preset gpt-nano --steps 4 --warmup-steps 1 --eval-interval 2 " \
        "--eval-batches 1 --quiet --no-samples"  # fmt: skip
LLAMA = TRAIN.replace("--preset gpt-nano", "--arch llama")


def _run_copy(paths: dict, work: Path) -> dict:
    """The gpt run with its checkpoints, to resume."""
    target = work / "in" / "gpt"
    shutil.copytree(paths["gpt"], target)
    return {"bad": str(target)}


RESUME = "train --resume {bad} --steps 20 --quiet --no-samples"
TRAINING = [
    cli("resume with another --arch", RESUME + " --arch llama", "--arch", setup=_run_copy),
    cli("resume with another --preset", RESUME + " --preset gpt-micro", "--preset", setup=_run_copy),
    cli("resume with another --tokenizer", RESUME + " --tokenizer word", "--tokenizer", setup=_run_copy),
    cli("resume with another --task", RESUME + " --task translate", "--task", setup=_run_copy),
    cli("resume with another --vocab-size", RESUME + " --vocab-size 500", ("--vocab-size", "vocab"), setup=_run_copy),
    cli("resume with the same --preset", RESUME + " --preset gpt-nano", (), expect="ok", setup=_run_copy, timeout=180),
    cli("train --rope-base 0", LLAMA + " --rope-base 0", ("--rope-base", "rope_base"), refused_leaves=("run",)),
    cli("train --rope-base -1", LLAMA + " --rope-base -1", ("--rope-base", "rope_base")),
    cli("train --rope-base nan", LLAMA + " --rope-base nan", ("--rope-base", "rope_base")),
    cli("train --rope-base inf", LLAMA + " --rope-base inf", ("--rope-base", "rope_base"), refused_leaves=("run",)),
    cli("train --dropout nan", TRAIN + " --dropout nan", "dropout"),
    cli("train --lr nan", TRAIN + " --lr nan", ("--lr", "lr = nan")),
    cli("train --lr inf", TRAIN + " --lr inf", ("--lr", "lr = inf")),
    cli("train --label-smoothing nan", TRAIN + " --label-smoothing nan", "label"),
    cli("train --grad-clip inf", TRAIN + " --grad-clip inf", ("grad-clip", "grad_clip")),
    cli("train --weight-decay -1", TRAIN + " --weight-decay -1", ("weight-decay", "weight_decay")),
    cli("train --val-fraction 1.5", TRAIN + " --val-fraction 1.5", ("val-fraction", "val_fraction")),
    cli("train --context-length 0", TRAIN + " --context-length 0", "context"),
    cli("train --n-kv-heads 3 (llama)", LLAMA + " --n-kv-heads 3", ("n_kv_heads", "n-kv-heads")),
    cli("train --positional banana", TRAIN + " --positional banana", "positional"),
    cli("train llama --max-time 0", LLAMA + " --max-time 0", "--max-time"),
    cli(
        "train translate --precision bf16",
        "train --task translate --data {pairs_tsv} --out {tmp}/run --steps 3 "
        "--eval-interval 3 --eval-batches 1 --bleu-sentences 2 --warmup-steps 1 --quiet --no-samples --precision bf16 "
        "--preset transformer-tiny",
        (),
        expect="ok",
        timeout=240,
    ),  # fmt: skip
    cli(
        "killed train, then resume",
        RESUME,
        (),
        expect="ok",
        timeout=240,
        setup=killed(
            [
                "train",
                "--data",
                "{text_txt}",
                "--out",
                "{tmp}/in/r",
                "--preset",
                "gpt-nano",
                "--steps",
                "400",
                "--eval-interval",
                "2",
                "--eval-batches",
                "1",
                "--quiet",
                "--no-samples",
            ],
            0,
            when_exists="{tmp}/in/r/checkpoints/latest.json",
        ),  # fmt: skip
    ),
]
TRAINING[-1].what = ["train", "--resume", "{tmp}/in/r", "--steps", "6", "--quiet", "--no-samples"]

# ---------------------------------------------------------------------------------- 6. permissions (as nobody)
UNREADABLE = ("permission", "cannot read", "not readable")


def _locked(setup, file: str | None = None, mode: int = 0):
    """``setup``'s {bad} (or ``file`` inside it) given ``mode``."""

    def locked(paths: dict, work: Path) -> dict:
        out = setup(paths, work)
        target = Path(out["bad"]) / file if file else Path(out["bad"])
        target.chmod(mode)
        return out

    return locked


def _fixture(name: str):
    return lambda paths, work: {"bad": str(copy(paths, work, name))}


def _read_only_folder(paths: dict, work: Path) -> dict:
    folder = work / "in" / "ro"
    folder.mkdir(parents=True)
    folder.chmod(0o555)
    return {"bad": str(folder)}


PERMISSIONS = [
    cli("chmod 000 run folder, generate", GEN_RUN, UNREADABLE, setup=chmod("gpt", None, 0), user=True),
    cli("chmod 000 HF folder, generate", GEN, UNREADABLE, setup=chmod("hf_llama", None, 0), user=True),
    cli(
        "chmod 000 model.safetensors (run), generate",
        GEN_RUN,
        UNREADABLE,
        setup=chmod("gpt", "model.safetensors", 0),
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 model.safetensors (HF), generate",
        GEN,
        UNREADABLE,
        setup=chmod("hf_llama", "model.safetensors", 0),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 config.json (HF), generate", GEN, UNREADABLE, setup=chmod("hf_llama", "config.json", 0), user=True),
    cli(
        "chmod 000 tokenizer.json (run), generate",
        GEN_RUN,
        UNREADABLE,
        setup=chmod("gpt", "tokenizer.json", 0),
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 tokenizer.json (HF), generate",
        GEN,
        UNREADABLE,
        setup=chmod("hf_llama", "tokenizer.json", 0),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 gguf file, generate", GEN, UNREADABLE, setup=_locked(_fixture("llama_gguf")), user=True),
    cli(
        "chmod 000 data file, train",
        TRAIN.replace("{text_txt}", "{bad}"),
        UNREADABLE,
        setup=_locked(_fixture("text_txt")),
        user=True,
    ),  # fmt: skip
    cli("chmod 000 eval text, eval", "eval {gpt} {bad}", UNREADABLE, setup=_locked(_fixture("text_txt")), user=True),
    cli(
        "chmod 000 chat template, chat",
        "chat {llama_gguf} --chat-template {bad}",
        UNREADABLE,
        setup=_locked(write("t.jinja", "{{ 1 }}")),
        stdin="hi\n",
        user=True,
    ),  # fmt: skip
    cli(
        "read-only output folder, quantize",
        "quantize {gpt} --out {bad}/q",
        ("cannot write", "permission"),
        setup=_read_only_folder,
        user=True,
    ),  # fmt: skip
    cli(
        "chmod 000 checkpoints, resume",
        "train --resume {bad} --steps 20 --quiet --no-samples",
        UNREADABLE,
        setup=_locked(_run_copy, "checkpoints"),
        user=True,
    ),  # fmt: skip
    cli("pytorch_model.bin with a pickled object", GEN, "pytorch_model.bin", setup=pickle_bin("object")),
    cli("pytorch_model.bin of plain tensors", GEN, (), expect="ok", setup=pickle_bin("tensors")),
]

# ---------------------------------------------------------------------------------- 7. killed writers
QUANTIZE = "quantize {gpt} --out {tmp}/cwd/q"


def _half_quantized(paths: dict, work: Path) -> dict:
    """A finished int8 copy whose config.json has not landed: killed right after the weights."""
    from qkv.cli import main

    out = work / "cwd" / "q"
    out.parent.mkdir(parents=True, exist_ok=True)
    main(["quantize", paths["gpt"], "--out", str(out)])
    (out / "config.json").unlink()
    return {}


KILLED = [
    cli("quantize killed after its weights landed, run again", QUANTIZE, (), expect="ok", setup=_half_quantized),
    cli(
        "quantize kill -9 while writing, run again",
        QUANTIZE,
        (),
        expect="ok",
        setup=killed(["quantize", "{gpt}", "--out", "{tmp}/cwd/q"], 0, when_exists="{tmp}/cwd/q"),
    ),  # fmt: skip
    cli(
        "export gguf kill -9, run again",
        "export {llama} --gguf {tmp}/cwd/m.gguf",
        (),
        expect="ok",
        setup=killed(["export", "{llama}", "--gguf", "{tmp}/cwd/m.gguf"], 0, when_exists="{tmp}/cwd/.m.gguf.*.tmp"),
    ),  # fmt: skip
]

ALL = [*TRAINING, *PERMISSIONS, *KILLED]
