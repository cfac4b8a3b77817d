"""Quantizing a whole model: every linear layer and the unembedding to weight-only int8, in place.

    from qkv.quantization import quantize_model
    quantize_model(bundle.model, "int8")        # W_q, W_k, W_v, W_o, W_1, W_2 and W_U become Int8Linear

Each ``nn.Linear`` (qkv's :class:`~qkv.layers.linear.Linear` included) and each
:class:`~qkv.layers.embedding.Unembedding` is replaced by an :class:`~qkv.layers.int8_linear.Int8Linear`
holding its weights as int8 with one scale per output channel. A token embedding tied to the unembedding
(W_U = W_E^T, GPT-2 and the paper) becomes an :class:`~qkv.layers.int8_embedding.Int8TokenEmbedding` that
reads its rows from the same int8 matrix, so the tie and its memory saving survive. Everything else
(untied embeddings, positions, LayerNorms, biases) stays in floating point.

With ``calibration=feed`` (a function that runs the float model on sample inputs), each weight's rounding is
chosen to minimise its layer's output error on those inputs (GPTQ, :mod:`qkv.gptq`) instead of rounding to
nearest: the same format, scales and speed, with less error (an unembedding tied to the embedding keeps
nearest rounding, as its rows are also the input vectors).

What was quantized is described by :func:`quantization_info` (the ``quantization.json`` of a saved model
folder, :mod:`qkv.model_dir`) and rebuilt from it by :func:`apply_quantization` before the int8 weights are
loaded, so a quantized folder loads without the original. The scheme names are :data:`SCHEMES`; the quality
and speed this buys are measured by ``bench/quantize.py`` (docs/deploy.md).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.gptq import gptq_round, input_hessians
from qkv.layers.embedding import Unembedding
from qkv.layers.int8_embedding import Int8TokenEmbedding
from qkv.layers.int8_linear import Int8Linear

SCHEMES = ("int8",)
FORMAT = "qkv-quantized"
FORMAT_VERSION = 1
DESCRIPTIONS = {
    "int8": "weight-only int8: symmetric, one scale per output channel (absmax / 127); activations stay float",
}


def check_scheme(scheme: str) -> str:
    """``scheme`` if qkv knows it, else a QkvError naming the ones it knows."""
    if scheme not in SCHEMES:
        raise QkvError(
            f"{scheme!r} is not a quantization scheme qkv has: use int8 (weight-only int8 with a scale per "
            "output channel)"
        )
    return scheme


def _float_linears(model: nn.Module) -> list[str]:
    """Names of the float linear layers and unembeddings, each module once (its first name)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Unembedding)) and not isinstance(module, Int8Linear)
    ]


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    """Put ``new`` wherever ``old`` hangs in the model (a shared module hangs in several places)."""
    for _, module in list(model.named_modules(remove_duplicate=False)):
        for child_name, child in list(module.named_children()):
            if child is old:
                setattr(module, child_name, new)


def _tied_embeddings(model: nn.Module, weight: torch.Tensor) -> list[nn.Embedding]:
    """The embeddings whose matrix is ``weight`` (W_E tied to W_U)."""
    found: list[nn.Embedding] = []
    for module in model.modules():
        if isinstance(module, nn.Embedding) and module.weight is weight and module not in found:
            found.append(module)
    return found


def _quantize_module(model: nn.Module, name: str, *, empty: bool, hessian: torch.Tensor | None = None) -> Int8Linear:
    module = model.get_submodule(name)
    if not isinstance(module, (nn.Linear, Unembedding)):
        raise QkvError(
            f"{name} is a {type(module).__name__}, not a linear layer: the quantized model does not match "
            "config.json; quantize the original run again"
        )
    weight, bias = module.weight, module.bias
    if empty:  # the structure only: the int8 weights are about to be loaded
        new = Int8Linear(weight.shape[1], weight.shape[0], bias=bias is not None).to(weight.device)
    else:
        new = Int8Linear.from_float(weight, bias)
    tied = _tied_embeddings(model, weight)
    if hessian is not None and not empty and not tied:
        new.qweight.data = gptq_round(weight, hessian, new.weight_scale).to(weight.device)
    for embedding in tied:
        _replace(model, embedding, Int8TokenEmbedding(new, scale=getattr(embedding, "scale", 1.0)))
    _replace(model, module, new)
    return new


def quantize_model(
    model: nn.Module, scheme: str = "int8", *, calibration: Callable[[nn.Module], object] | None = None
) -> nn.Module:
    """Quantize every linear layer and the unembedding of ``model`` in place (see the module docstring).

    ``calibration``, if given, is called once with the float model (in eval mode, without gradients) and
    must run its own forward on sample inputs; the rounding then minimises each layer's output error on them
    (:mod:`qkv.gptq`). Layers it never reaches are rounded to nearest. Returns the model, in eval mode: a
    quantized model is for inference, never trained. A model that is already quantized is returned as it is.
    """
    check_scheme(scheme)
    names = _float_linears(model)
    hessians = input_hessians(model.eval(), names, calibration) if calibration is not None and names else {}
    with torch.no_grad():
        for name in names:
            _quantize_module(model, name, empty=False, hessian=hessians.pop(name, None))
    return model.eval()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8Linear) for module in model.modules())


def quantization_info(model: nn.Module) -> dict[str, Any] | None:
    """What ``quantization.json`` holds for ``model`` (None when it has no int8 layer)."""
    modules = [name for name, module in model.named_modules() if isinstance(module, Int8Linear)]
    if not modules:
        return None
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "scheme": "int8",
        "description": DESCRIPTIONS["int8"],
        "modules": modules,
    }


def apply_quantization(model: nn.Module, info: Any, where: str = "quantization.json") -> nn.Module:
    """Give a freshly built float ``model`` the int8 layers ``info`` describes, ready to load int8 weights into."""
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("modules"), list):
        raise QkvError(f"{where} is not a qkv quantization description: restore it, or quantize the run again")
    if info.get("version", FORMAT_VERSION) > FORMAT_VERSION or info.get("scheme") not in SCHEMES:
        raise QkvError(
            f"{where} describes {info.get('scheme')!r} weights (format version {info.get('version')}), which this "
            "qkv cannot read: upgrade qkv, or quantize the original run with this version"
        )
    with torch.no_grad():
        for name in info["modules"]:
            try:
                _quantize_module(model, name, empty=True)
            except AttributeError:
                raise QkvError(
                    f"{where} names a layer {name} that the model in config.json does not have: "
                    "the files come from different runs; quantize the original run again"
                ) from None
    return model.eval()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's saved tensors (its state dict), each shared tensor counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tensor.numel())
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def _check_out_dir(out: Path, source: Path) -> None:
    """Refuse an output folder whose files a quantized copy would overwrite or mix with."""
    if out.exists() and not out.is_dir():
        raise QkvError(f"--out {out} is a file: give a folder for the quantized model")
    if out.resolve() == source.resolve():
        raise QkvError(f"--out {out} is the model itself: its float weights would be replaced; give a new folder")
    if (out / "train_config.json").exists() or (out / "checkpoints").exists():
        raise QkvError(f"--out {out} holds a training run, whose weights would be replaced: give a new folder")
    if out.is_dir() and any(out.iterdir()) and not (out / "quantization.json").is_file():
        raise QkvError(f"--out {out} already holds other files: give a new or empty folder")


def text_calibration(bundle: Any, text: str) -> Callable[[nn.Module], object]:
    """A ``calibration`` feed for :func:`quantize_model` from sample text, for the model in ``bundle``.

    A GPT reads ``text`` as running text (in windows of its context); an encoder embeds its non-empty lines
    as sentences. Both run the model's own forward, so every layer sees its inputs.
    """
    from qkv.models import GPT, Encoder

    model = bundle.model
    if isinstance(model, GPT):
        from qkv.training.perplexity import token_log_probs

        ids = bundle.tokenizer.encode(text)
        return lambda m: token_log_probs(m, ids)
    if isinstance(model, Encoder):
        from qkv.pretrained.bert import embed_sentences

        lines = [line for line in text.splitlines() if line.strip()]

        def embed(m: nn.Module) -> object:
            with_model = copy.copy(bundle)
            with_model.model = m
            return embed_sentences(with_model, lines, engine="model")

        return embed
    raise QkvError(
        f"calibration text works for GPT and encoder models, not a {type(model).__name__}: quantize it "
        "without --calibrate (nearest rounding)"
    )


def save_quantized(
    bundle: Any, out_dir: str | Path, scheme: str = "int8", *, calibration_text: str | None = None
) -> Path:
    """Quantize ``bundle.model`` (a :class:`~qkv.model_dir.ModelBundle`) in place and save it as a model folder.

    The folder loads with :func:`qkv.model_dir.load_model_dir` like any other, int8 layers and all; a
    sentence-transformers head (pooling, normalisation) beside the source model is copied along. With
    ``calibration_text`` the roundings are calibrated on it (:func:`text_calibration`, :mod:`qkv.gptq`).
    """
    from qkv.model_dir import save_model_dir
    from qkv.pretrained.bert import copy_sentence_head

    check_scheme(scheme)
    out = Path(out_dir)
    _check_out_dir(out, Path(bundle.path))
    if is_quantized(bundle.model):
        raise QkvError(f"{bundle.path} is quantized already: quantize the float model it was made from")
    calibration = None if calibration_text is None else text_calibration(bundle, calibration_text)
    quantize_model(bundle.model, scheme, calibration=calibration)
    save_model_dir(out, bundle.model, bundle.tokenizer, bundle.target_tokenizer)
    copy_sentence_head(bundle.path, out)
    return out
