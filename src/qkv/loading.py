"""Opening a model: the one function the command line, the server, :class:`~qkv.decoding.translator.Translator`
and the docs call, whatever the model is and wherever it lies.

    import qkv
    bundle = qkv.load("runs/shakespeare")          # a run folder: its best model, else its latest checkpoint
    bundle = qkv.load("runs/shakespeare-int8")     # a folder written by `qkv quantize` (int8 layers and all)
    bundle = qkv.load("models/opus-mt-en-fr")      # a Hugging Face folder (GPT-2, BERT, Marian, Llama, ...)
    bundle = qkv.load("gpt2")                      # a Hub name, downloaded when online
    bundle = qkv.load("SmolLM2-135M.Q4_1.gguf")    # a GGUF file (llama.cpp's format): its 4- and 8-bit blocks
                                                   # as qkv int4 / int8 layers (dequantize=True: all float32)
    bundle.model, bundle.tokenizer, bundle.config  # a qkv model in eval mode, its tokenizer(s), its config

What kind of model came back is a question for its family (:func:`qkv.models.family.family_of`), not for
the path: a verb that needs a translator asks ``family_of(bundle.model).require_role("translator", ...)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from qkv.errors import QkvError
from qkv.model_dir import CONFIG_FILE, ModelBundle, load_model_dir
from qkv.pretrained.loader import load_pretrained
from qkv.quantization import check_scheme, quantize_model
from qkv.run_dir import latest_checkpoint
from qkv.storage import MODEL_FILE


def load(
    path: str | Path, *, device: str | torch.device = "cpu", quantize: str | None = None, dequantize: bool = False
) -> ModelBundle:
    """The model at ``path`` on ``device``, in eval mode, with its tokenizer(s) and config.

    ``path`` is a qkv run or model folder (one without a best model yet opens its latest checkpoint), a
    folder written by ``qkv quantize``, a Hugging Face folder (a config.json with a ``model_type``), a GGUF
    file (recognised by its first bytes, :func:`qkv.pretrained.gguf.load_gguf`), or, when online, a Hub name such as
    ``gpt2`` or ``Helsinki-NLP/opus-mt-en-fr``. ``quantize="int8"`` (or "int4")
    quantizes the loaded weights (:func:`qkv.quantization.quantize_model`). A GGUF file's Q4_0, Q4_1, Q4_K and
    Q8_0 matrices load as qkv's int4 and int8 layers; ``dequantize=True`` makes every tensor float32 instead.
    Every problem with the path or its files is a one-line :class:`~qkv.errors.QkvError`.
    """
    if quantize is not None:
        check_scheme(quantize)  # before the (slow) load
        bundle = load(path, device=device, dequantize=dequantize)
        quantize_model(bundle.model, quantize)
        return bundle
    folder = Path(path)
    if folder.is_file():
        return _load_file(folder, device, dequantize)
    if folder.exists():
        return load_pretrained(folder, device=device) if is_hugging_face_folder(folder) else _load_run(folder, device)
    name = str(path)
    if name.lower().endswith(".gguf"):
        raise QkvError(f"{path} does not exist: check the path to the .gguf file")
    first = Path(name.split("/")[0])
    if name.count("/") <= 1 and not name.startswith((".", "/", "~")) and not first.exists():
        return load_pretrained(name, device=device)  # a Hub name
    return _load_run(folder, device)  # says that the path does not exist


def is_hugging_face_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a Hugging Face model: a config.json with a ``model_type``."""
    try:
        return "model_type" in json.loads((Path(folder) / CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, TypeError):
        return False


def _load_file(path: Path, device: str | torch.device, dequantize: bool = False) -> ModelBundle:
    """A model file: GGUF (by its magic bytes, whatever its name); any other file is one line saying what to give."""
    from qkv.gguf import is_gguf_file
    from qkv.pretrained.gguf import load_gguf

    if is_gguf_file(path):
        return load_gguf(path, device=device, dequantize=dequantize)
    raise QkvError(
        f"{path} is a file, and the only model files qkv opens are GGUF files (llama.cpp's format): give a .gguf "
        "file, a run directory written by `qkv train` or a Hugging Face model folder"
    )


def _load_run(run: Path, device: str | torch.device) -> ModelBundle:
    """A qkv model folder; a run that has no best model yet opens from its latest checkpoint (with a note)."""
    weights = None
    if run.is_dir() and not (run / MODEL_FILE).exists():
        latest = latest_checkpoint(run)
        if latest is not None:
            print(f"note: {run} has no best model yet; using the latest checkpoint {latest.name}", file=sys.stderr)
            weights = latest / MODEL_FILE
    return load_model_dir(run, device=device, weights_path=weights)
