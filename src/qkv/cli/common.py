"""Helpers shared by the commands: loading a run directory for use, reading prompts and files."""

from __future__ import annotations

import sys
from pathlib import Path

from qkv.errors import QkvError
from qkv.model_dir import ModelBundle, load_model_dir
from qkv.models.config import TRANSLATORS


def load_for_use(path: str, *, expect: str, device: str = "cpu", quantize: str | None = None) -> ModelBundle:
    """Load a run directory or pretrained model (see :func:`load_any`) and check its kind.

    ``expect`` is the model kind the command works with ("gpt", "transformer" or "encoder"); "transformer"
    takes every translator (an RNNSearch too).
    """
    bundle = load_any(path, device=device, quantize=quantize)
    kind = "transformer" if bundle.config.kind in TRANSLATORS else bundle.config.kind
    if kind != expect:
        uses = {"gpt": "qkv generate", "transformer": "qkv translate", "encoder": "qkv embed"}
        use = uses.get(kind, "qkv embeddings")
        names = {
            "gpt": "a GPT language model",
            "transformer": "an encoder-decoder translator",
            "encoder": "an encoder",
            "word2vec": "Word2Vec word vectors",
        }
        raise QkvError(f"{path} holds {names[kind]}, not {names[expect]}: use `{use}` with it")
    return bundle


def load_any(path: str, *, device: str = "cpu", quantize: str | None = None) -> ModelBundle:
    """A qkv run directory, or a pretrained model: a Hugging Face folder (config.json with a model_type) or,
    when online, a Hub name such as ``gpt2`` or ``Helsinki-NLP/opus-mt-en-fr``. A run that has no best
    model yet is loaded from its latest checkpoint. ``quantize="int8"`` quantizes the loaded model's
    weights (:func:`qkv.quantization.quantize_model`); a folder written by ``qkv quantize`` is int8 already."""
    if quantize is not None:
        from qkv.quantization import check_scheme, quantize_model

        check_scheme(quantize)  # before the (slow) load
        bundle = load_any(path, device=device)
        quantize_model(bundle.model, quantize)
        return bundle
    folder = Path(path)
    if folder.exists():
        return load_pretrained_folder(folder, device) if _is_hugging_face_folder(folder) else _load_run(folder, device)
    first = Path(path.split("/")[0])
    if path.count("/") <= 1 and not path.startswith((".", "/", "~")) and not first.exists():
        return load_pretrained_folder(path, device)  # a Hub name
    return _load_run(folder, device)  # says that the path does not exist


def _is_hugging_face_folder(folder: Path) -> bool:
    import json

    try:
        return "model_type" in json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def load_pretrained_folder(path: str | Path, device: str) -> ModelBundle:
    from qkv.pretrained import load_pretrained

    return load_pretrained(path, device=device)


def _load_run(run: Path, device: str) -> ModelBundle:
    from qkv.training.checkpoint import latest_checkpoint

    weights = None
    if run.is_dir() and not (run / "model.safetensors").exists():
        latest = latest_checkpoint(run)
        if latest is not None:
            print(f"note: {run} has no best model yet; using the latest checkpoint {latest.name}", file=sys.stderr)
            weights = latest / "model.safetensors"
    return load_model_dir(run, device=device, weights_path=weights)


def add_model_argument(parser, *, what: str = "a run directory written by `qkv train`") -> None:
    """RUN_DIR as a positional argument, or --model: a run directory or a pretrained model folder/name."""
    parser.add_argument("run_dir", metavar="RUN_DIR", nargs="?", help=what)
    parser.add_argument(
        "--model", help="a pretrained model instead: a Hugging Face folder (GPT-2, BERT, Marian) or a Hub name"
    )


def add_quantize_argument(parser) -> None:
    """--quantize SCHEME: run the model with int8 weights (quantized as it loads)."""
    parser.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="int8: quantize the weights as the model loads (weight-only int8, a scale per output channel; "
        "about 4x less weight memory; see docs/deploy.md)",
    )


def model_path(args) -> str:
    """The model the user named with RUN_DIR or --model (exactly one of them)."""
    if args.run_dir and args.model:
        raise QkvError("give the model once: either RUN_DIR or --model")
    if not (args.run_dir or args.model):
        raise QkvError("which model? give a run directory (RUN_DIR) or --model PATH_OR_NAME")
    return args.run_dir or args.model


def add_engine_argument(parser) -> None:
    """--engine: how decoding runs its steps (qkv.decoding.engine)."""
    from qkv.decoding.engine import ENGINES

    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="auto",
        help="how each decoding step runs: auto (default: a CUDA graph on a GPU, the static-cache step elsewhere), "
        "model (the model's own forward, the reference), static, compiled (torch.compile; slow to start), "
        "graph or compiled-graph (CUDA only)",
    )


def add_device_arguments(parser, *, device: bool = True) -> None:
    """--device (default auto) and --threads: where the model runs, for every verb that runs one."""
    if device:
        parser.add_argument(
            "--device",
            default="auto",
            help="auto (the default: a CUDA GPU, then Apple's MPS, then the CPU), cpu, cuda, cuda:N or mps",
        )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads torch may use (default: all cores)")


def use_device(args) -> str:
    """Apply --threads and resolve --device (QkvError for a device that is absent or not a device); returns
    the device name to load the model on, e.g. "cpu" or "cuda:0"."""
    from qkv.training.device import resolve_device, set_threads

    set_threads(getattr(args, "threads", None))
    return str(resolve_device(getattr(args, "device", "cpu")))


def note_unknown(tokenizer, text: str, what: str = "the text") -> None:
    """Print (to stderr) how many tokens of ``text`` became <unk>, if any: one shared line for every verb."""
    from qkv.tokenizers.base import unknown_note

    if text:
        note = unknown_note(tokenizer, text, what)
        if note:
            print(note, file=sys.stderr)
