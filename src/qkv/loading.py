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
from dataclasses import replace
from pathlib import Path

import torch

from qkv.adapter_dir import ADAPTER_FILE, is_adapter_dir, load_adapter, read_adapter_config
from qkv.data.builtin import calibration_sample
from qkv.devices import resolve_device
from qkv.errors import QkvError
from qkv.io import check_readable
from qkv.model_dir import CONFIG_FILE, ModelBundle, load_model_dir, read_chat_template
from qkv.models.lora import has_lora, merge_lora
from qkv.pretrained.loader import load_pretrained
from qkv.quantization import check_scheme, is_quantized, quantize_model, set_activations
from qkv.quantization.model import check_activations, group_sizes
from qkv.quantization.smoothing import smoothing_feed
from qkv.run_dir import latest_checkpoint
from qkv.storage import MODEL_FILE


def load(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    quantize: str | None = None,
    group_size: int | None = None,
    merge_adapters: bool = False,
    dequantize: bool = False,
    activations: str | None = None,
) -> ModelBundle:
    """The model at ``path`` on ``device``, in eval mode, with its tokenizer(s) and config.

    ``path`` is a qkv run or model folder (one without a best model yet opens its latest checkpoint), a
    folder written by ``qkv quantize``, a Hugging Face folder (a config.json with a ``model_type``), a GGUF
    file (recognised by its first bytes, :func:`qkv.pretrained.gguf.load_gguf`), or, when online, a Hub name such as
    ``gpt2`` or ``Helsinki-NLP/opus-mt-en-fr``. ``quantize="int8"`` (or "int4")
    quantizes the loaded weights (:func:`qkv.quantization.quantize_model`), in groups of ``group_size`` weights
    (None: the scheme's default; int8's 0 is a scale per row); with ``activations="int8"`` too, the inputs' large
    channels are first moved into the weights (:func:`qkv.quantization.smoothing.smoothing_feed`). A GGUF file's Q4_0,
    Q4_1, Q4_K and Q8_0 matrices load as qkv's int4 and int8 layers; ``dequantize=True`` makes every tensor float32
    instead. A LoRA adapter folder (a ``qkv train --lora`` run, :mod:`qkv.adapter_dir`) opens as its base with the
    adapters (a GGUF base in float32, as it was trained); ``merge_adapters=True`` folds them into the float base
    instead (W + (alpha / r) B A: plain layers, what ``qkv merge`` saves). ``activations`` ("float", "int8" or
    "int8x2") sets how the int8 and int4 layers treat their inputs (:func:`qkv.quantization.set_activations`; None:
    as the folder says, float for a GGUF). Every problem with the path or its files is a one-line
    :class:`~qkv.errors.QkvError`.
    """
    device = resolve_device(device, flag="device")  # "banana", or cuda without a GPU: one line, before the load
    if activations is not None:
        check_activations(activations)  # before the load
    if quantize is not None:
        return _load_quantized(path, device, quantize, group_size, activations, merge_adapters)
    if activations is not None:
        bundle = load(path, device=device, merge_adapters=merge_adapters, dequantize=dequantize)
        return with_activations(bundle, activations, path)
    if group_size is not None:
        raise QkvError(f"group_size={group_size} is for quantizing on load: add quantize='int8' or 'int4'")
    if not isinstance(path, str | Path) or not str(path).strip():
        raise QkvError(
            f"{path!r} is not a model path: give a run folder, a Hugging Face folder, a .gguf file or a Hub name"
        )
    folder = Path(path)
    check_readable(folder, "the model")
    if folder.is_dir() and is_adapter_dir(folder):
        return _load_lora(folder, device, merge=merge_adapters)
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


def _load_quantized(
    path: str | Path, device: torch.device, scheme: str, group_size: int | None, activations: str | None, merge: bool
) -> ModelBundle:
    """The float model at ``path`` quantized as it loads; smoothed first for int8 activations over int8 weights,
    on a page of the built-in corpus (as ``qkv quantize`` without --calibrate)."""
    check_scheme(scheme)  # before the (slow) load
    group_sizes(scheme, group_size)  # the size itself (quantize_model checks it against the layers)
    bundle = load(path, device=device, merge_adapters=merge, dequantize=True)  # from float weights
    feed = smoothing_feed(bundle, calibration_sample()) if activations == scheme == "int8" else None
    quantize_model(bundle.model, scheme, group_size=group_size, activations=activations or "float", smoothing=feed)
    return bundle


def with_activations(bundle: ModelBundle, activations: str, path: str | Path) -> ModelBundle:
    """``bundle`` with its int8 and int4 layers set to ``activations`` (int8 on a model without them: refused)."""
    if activations != "float" and not is_quantized(bundle.model):
        raise QkvError(
            f"{activations} activations are for int8 and int4 layers, and {path} has none as loaded: load a GGUF's "
            "quantized blocks (without --dequantize), a `qkv quantize` folder, or add --quantize int8"
        )
    set_activations(bundle.model, activations)
    return bundle


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


def _load_lora(folder: Path, device: str | torch.device, *, merge: bool) -> ModelBundle:
    """A LoRA adapter folder (a ``qkv train --lora`` run, or PEFT's own): its base (int8 if the run trained over
    int8, float when merging) with the adapters applied (or merged); a run with no adapters saved yet uses its
    latest checkpoint (with a note)."""
    config = read_adapter_config(folder)
    base = Path(config.base).expanduser()
    if not base.is_absolute() and (folder / base).exists():
        base = folder / base  # a path relative to the adapter's folder first, then to the working folder
    elif not base.exists() and base.is_absolute():
        raise QkvError(
            f"{folder}'s adapters adapt {base} (adapter_config.json's base_model_name_or_path), which does not "
            "exist: put the base model back there, or write its new path into adapter_config.json"
        )
    quantize = None if merge else config.base_quantization
    group_size = config.base_group_size if quantize else None  # as the run trained over (None: the default)
    bundle = load(base, device=device, quantize=quantize, group_size=group_size, dequantize=True)
    if has_lora(bundle.model):  # the base is itself a LoRA run: its adapters merged into it first
        merge_lora(bundle.model)
    checkpoint = None
    if not (folder / ADAPTER_FILE).is_file():
        latest = latest_checkpoint(folder)
        if latest is None:
            raise QkvError(f"{folder} has no {ADAPTER_FILE} and no checkpoint yet: train it first, or wait for one")
        print(f"note: {folder} has no best adapters yet; using the latest checkpoint {latest.name}", file=sys.stderr)
        checkpoint = latest / MODEL_FILE
    load_adapter(bundle.model, folder, checkpoint=checkpoint)
    if merge:
        merge_lora(bundle.model)
    return replace(bundle, path=folder, chat_template=read_chat_template(folder) or bundle.chat_template)
