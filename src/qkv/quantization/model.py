"""Quantizing a whole model: every linear layer and the unembedding to weight-only int8, in place.

    from qkv.quantization import quantize_model
    quantize_model(bundle.model, "int8")        # W_q, W_k, W_v, W_o, W_1, W_2 and W_U become Int8Linear

Each ``nn.Linear`` (qkv's :class:`~qkv.layers.linear.Linear` included) and each
:class:`~qkv.layers.embedding.Unembedding` is replaced by an :class:`~qkv.quantization.int8_linear.Int8Linear`
holding its weights as int8 with one scale per output channel. A token embedding tied to the unembedding
(W_U = W_E^T, GPT-2 and the paper) becomes an :class:`~qkv.quantization.int8_embedding.Int8TokenEmbedding`
that reads its rows from the same int8 matrix, so the tie and its memory saving survive. Everything else
(untied embeddings, positions, LayerNorms, biases) stays in floating point.

With ``calibration=feed`` (a function that runs the float model on sample inputs), each weight's rounding is
chosen to minimise its layer's output error on those inputs (GPTQ, :mod:`qkv.quantization.gptq`) instead of
rounding to nearest: the same format, scales and speed, with less error (an unembedding tied to the
embedding keeps nearest rounding, as its rows are also the input vectors).

``activations="int8"`` (or :func:`set_activations` on a loaded int8 model) makes the layers quantize their
inputs too, per vector, and use the CPU's int8 products (:mod:`qkv.quantization.dynamic`): the same saved
weights, faster, with a little more error. The scheme names are :data:`SCHEMES`; the quality and speed this
buys are measured by ``bench/quantize.py`` (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.layers.embedding import Unembedding
from qkv.quantization.gptq import gptq_round, input_hessians
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import ACTIVATIONS, Int8Linear

SCHEMES = ("int8",)
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


def set_activations(model: nn.Module, activations: str) -> nn.Module:
    """Make every int8 layer of ``model`` keep its inputs in float ("float", weight-only) or quantize them per
    vector ("int8"); the weights are untouched. Returns the model."""
    if activations not in ACTIVATIONS:
        raise QkvError(f"activations={activations!r}: choose float (weight-only int8) or int8 (inputs quantized too)")
    for module in model.modules():
        if isinstance(module, Int8Linear):
            module.activations = activations
    model.__dict__.pop("_fast_step", None)  # its stacked W_q/W_k/W_v copies were made in the old mode
    return model


def quantize_model(
    model: nn.Module,
    scheme: str = "int8",
    *,
    calibration: Callable[[nn.Module], object] | None = None,
    activations: str = "float",
) -> nn.Module:
    """Quantize every linear layer and the unembedding of ``model`` in place (see the module docstring).

    ``calibration``, if given, is called once with the float model (in eval mode, without gradients) and
    must run its own forward on sample inputs; the rounding then minimises each layer's output error on them
    (:mod:`qkv.gptq`). Layers it never reaches are rounded to nearest. Returns the model, in eval mode: a
    quantized model is for inference, never trained. A model that is already quantized is returned as it is.
    ``activations`` is passed to :func:`set_activations`.
    """
    check_scheme(scheme)
    if activations not in ACTIVATIONS:
        raise QkvError(f"activations={activations!r}: choose float (weight-only int8) or int8 (inputs quantized too)")
    names = _float_linears(model)
    hessians = input_hessians(model.eval(), names, calibration) if calibration is not None and names else {}
    with torch.no_grad():
        for name in names:
            _quantize_module(model, name, empty=False, hessian=hessians.pop(name, None))
    return set_activations(model, activations).eval()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, Int8Linear) for module in model.modules())


def quantization_scheme(model: nn.Module) -> str | None:
    """The scheme of the model's int8 layers ("int8"), or None for a float model."""
    return "int8" if is_quantized(model) else None


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
