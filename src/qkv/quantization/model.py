"""Quantizing a whole model: every linear layer and the unembedding to weight-only int8 or int4, in place.

    from qkv.quantization import quantize_model
    quantize_model(bundle.model, "int8")        # W_q, W_k, W_v, W_o, W_1, W_2 and W_U become Int8Linear
    quantize_model(bundle.model, "int8", group_size=0)   # the same with one scale per output row
    quantize_model(bundle.model, "int4")        # the same as Int4Linear (groups of 32), W_U as Int8Linear

Each ``nn.Linear`` (qkv's :class:`~qkv.layers.linear.Linear` included) and each
:class:`~qkv.layers.embedding.Unembedding` is replaced by an :class:`~qkv.quantization.int8_linear.Int8Linear`
holding its weights as int8 with one scale per g = ``group_size`` weights of a row (GGUF's Q8_0 for g = 32, the
default where every layer's input width is a multiple of 32), or with g = 0 one scale per output channel (the
default for other widths). A token embedding tied to the unembedding (W_U = W_E^T, GPT-2 and the paper) becomes
an :class:`~qkv.quantization.int8_embedding.Int8TokenEmbedding` that reads its rows from the same int8 matrix, so
the tie and its memory saving survive. Everything else (untied embeddings, positions, LayerNorms, biases) stays in
floating point.

With the scheme "int4" the linear layers become :class:`~qkv.quantization.int4_linear.Int4Linear` (groups of
``group_size`` weights with a scale and a minimum each) and the unembedding, and any layer tied to an
embedding, stays int8 (``int8_group_size``, with the same default): the logits are the output most sensitive to
rounding, and a tied matrix is also read row by row as the input vectors (llama.cpp's Q4 files keep
it at 8 bits too, Q8_0).

With ``calibration=feed`` (a function that runs the float model on sample inputs), each weight's rounding is
chosen to minimise its layer's output error on those inputs (GPTQ, :mod:`qkv.quantization.gptq`) instead of
rounding to nearest: the same format, scales and speed, with less error (an unembedding tied to the
embedding keeps nearest rounding, as its rows are also the input vectors).

``activations="int8"`` (or :func:`set_activations` on a loaded int8 model) makes the int8 layers quantize their
inputs too, per vector, and use the CPU's int8 products (:mod:`qkv.quantization.dynamic`): the same saved
weights, faster, with a little more error. The scheme names are :data:`SCHEMES`; the quality and speed this
buys are measured by ``bench/quantize.py`` and ``bench/int4_linear.py`` (docs/deploy.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.layers.embedding import Unembedding
from qkv.quantization.activation_blocks import ROUNDINGS
from qkv.quantization.activation_modes import ROUNDED_TWICE_UNDER_INT8, layer_modes
from qkv.quantization.gptq import gptq_round, gptq_round_groups, input_hessians
from qkv.quantization.int4_linear import GROUP_SIZE, Int4Linear, check_group_size
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import ACTIVATIONS, Int8Linear
from qkv.quantization.int8_linear import check_group_size as check_int8_group_size
from qkv.quantization.smoothing import Progress, smooth_model

SCHEMES = ("int8", "int4")
INT8_GROUP_SIZE = 32  # int8 layers' default group size where every int8 layer's input width is a multiple of it
BITS = {"int8": 8, "int4": 4}
DESCRIPTIONS = {
    "int8": "int8 weights: symmetric, one scale per output channel (absmax / 127)",
    "int4": "int4 weights: groups of group_size weights along each row with a float16 scale and minimum "
    "(w = s q + m, q in 0..15); the unembedding int8 per channel",
}
"""What quantization.json's description says of the weights (int8 layers per row); :func:`description` adds
the activations and says so when the int8 layers have scales per group."""


def description(scheme: str, activations: str, int8_group_size: int = 0) -> str:
    """quantization.json's description: the weights (:data:`DESCRIPTIONS`, with "per group of g weights" for
    grouped int8 layers), then what happens to the activations ("activations" says the same as a field: float,
    or int8 for W8A8 and W4A8)."""
    weights = DESCRIPTIONS[scheme]
    if int8_group_size:
        groups = f"one scale per group of {int8_group_size} weights along each row"
        weights = weights.replace("one scale per output channel", groups).replace(
            "int8 per channel", f"int8 with {groups}"
        )
    if activations in ROUNDINGS:
        kind = "W4A8" if scheme == "int4" else "W8A8"
        twice = "every input" if ROUNDINGS[activations] == 2 else f"the inputs of {ROUNDED_TWICE_UNDER_INT8}"
        return (
            f"{weights}; activations int8 too (each input vector quantized in blocks of 32; {twice} then what that "
            f"missed the same way; {kind})"
        )
    return f"{weights}; activations stay float (weight-only)"


QUANTIZED = (Int8Linear, Int4Linear)  # the layer classes a quantized model holds


def check_scheme(scheme: str) -> str:
    """``scheme`` if qkv knows it, else a QkvError naming the ones it knows."""
    if scheme not in SCHEMES:
        raise QkvError(
            f"{scheme!r} is not a quantization scheme qkv has: use int8 (weight-only int8, a scale per 32 "
            "weights or per output channel) or int4 (groups of 32 weights with a scale and a minimum)"
        )
    return scheme


def check_activations(activations: str) -> str:
    """``activations`` if it is "float", "int8" or "int8x2" (how int8 and int4 layers treat their inputs), else a
    QkvError."""
    if activations not in ACTIVATIONS:
        raise QkvError(
            f"activations {activations!r}: choose float (the inputs of int8 and int4 layers stay float), int8 "
            "(rounded to int8 in blocks of 32 too: W8A8, W4A8, as llama.cpp's products; W_2's and W_U's twice) or "
            "int8x2 (every input rounded twice: closer to float, at twice the integer products)"
        )
    return activations


def scheme_for_bits(bits: int) -> str:
    """The scheme of ``bits`` (8: int8, 4: int4), else a QkvError."""
    schemes = {b: name for name, b in BITS.items()}
    if bits not in schemes:
        raise QkvError(
            f"--bits {bits}: qkv quantizes to 8 bits (int8, a scale per 32 weights or per output channel) or 4 bits "
            "(int4, groups of --group-size weights); use --bits 8 or --bits 4"
        )
    return schemes[bits]


def _float_linears(model: nn.Module) -> list[str]:
    """Names of the float linear layers and unembeddings, each module once (its first name)."""
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, (nn.Linear, Unembedding)) and not isinstance(module, QUANTIZED)
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


def _takes_int4(model: nn.Module, module: nn.Module) -> bool:
    """Whether the int4 scheme makes ``module`` int4: every linear layer but the unembedding and tied ones."""
    return not isinstance(module, Unembedding) and not _tied_embeddings(model, cast(torch.Tensor, module.weight))


def _quantize_module(
    model: nn.Module,
    name: str,
    *,
    empty: bool,
    hessian: torch.Tensor | None = None,
    scheme: str = "int8",
    group_size: int = GROUP_SIZE,
    int8_group_size: int = 0,
) -> nn.Module:
    """Replace the float layer ``name`` by its int8 or int4 layer (``empty``: the structure only, for loading);
    ``group_size`` is the int4 layers', ``int8_group_size`` the int8 layers' (0: a scale per row)."""
    module = model.get_submodule(name)
    if not isinstance(module, (nn.Linear, Unembedding)):
        raise QkvError(
            f"{name} is a {type(module).__name__}, not a linear layer: the quantized model does not match "
            "config.json; quantize the original run again"
        )
    weight, bias = module.weight, module.bias
    tied = _tied_embeddings(model, weight)
    if scheme == "int4" and _takes_int4(model, module):
        if empty:
            new: nn.Module = Int4Linear(weight.shape[1], weight.shape[0], bias=bias is not None, group_size=group_size)
        else:
            new = Int4Linear.from_float(weight, bias, group_size)
            if hessian is not None:
                new.set_groups(*gptq_round_groups(weight, hessian, group_size))
        _replace(model, module, new.to(weight.device))
        return new
    if empty:  # the structure only: the int8 weights are about to be loaded
        new = Int8Linear(weight.shape[1], weight.shape[0], bias=bias is not None, group_size=int8_group_size)
        new = new.to(weight.device)
    else:
        new = Int8Linear.from_float(weight, bias, int8_group_size)
    if hessian is not None and not empty and not tied:
        new.qweight.data = gptq_round(weight, hessian, new.weight_scale).to(weight.device)
    for embedding in tied:
        _replace(model, embedding, Int8TokenEmbedding(new, scale=getattr(embedding, "scale", 1.0)))
    _replace(model, module, new)
    return new


def int8_default_group_size(model: nn.Module, scheme: str) -> int:
    """The int8 layers' group size when none is asked for: :data:`INT8_GROUP_SIZE` (GGUF's Q8_0 block) where it
    divides the input width of every layer that becomes int8, else 0 (one scale per row, which fits any width).

    Groups of 32 leave less rounding error (one large weight coarsens 32 others, not a whole row): on SmolLM2-135M
    the teacher-forced agreement with float32 rises from 96.5% to 97.9% (docs/generation.md), for 4 more bytes of
    scale per 32 weights. Toy models whose widths are not multiples of 32 keep a scale per row."""
    for name in _float_linears(model):
        module = model.get_submodule(name)
        int8 = scheme == "int8" or not _takes_int4(model, module)
        if int8 and cast(torch.Tensor, module.weight).shape[1] % INT8_GROUP_SIZE:
            return 0
    return INT8_GROUP_SIZE


def group_sizes(scheme: str, group_size: int | None = None, int8_group_size: int | None = None) -> tuple[int, int]:
    """(the int4 layers' group size, the int8 layers' one) that ``quantize_model``'s arguments ask for.

    ``group_size`` is the scheme's: int4 (default 32) or, for the int8 scheme, the int8 layers'; ``int8_group_size``
    is the int4 scheme's int8 layers' (the unembedding). An int8 size not given is 0 here (nothing to check
    against the layers): :func:`quantize_model` first fills it in for the model (:func:`int8_default_group_size`).
    Each value is checked by itself here (:func:`check_group_size_fits` checks it against the layers)."""
    if scheme == "int8":
        if group_size is not None and int8_group_size is not None and group_size != int8_group_size:
            raise QkvError(
                f"group_size={group_size} and int8_group_size={int8_group_size}: the int8 scheme has one group "
                "size for all its layers; give one of them"
            )
        int8 = group_size if group_size is not None else int8_group_size
        return GROUP_SIZE, check_int8_group_size(0 if int8 is None else int8)
    int4 = check_group_size(GROUP_SIZE if group_size is None else group_size)
    return int4, check_int8_group_size(0 if int8_group_size is None else int8_group_size)


def _with_default_int8(
    model: nn.Module, scheme: str, group_size: int | None, int8_group_size: int | None
) -> tuple[int | None, int | None]:
    """(group_size, int8_group_size) with the int8 layers' size filled in (:func:`int8_default_group_size`) where
    neither argument gives it."""
    if scheme == "int8" and group_size is None and int8_group_size is None:
        return int8_default_group_size(model, scheme), None
    if scheme == "int4" and int8_group_size is None:
        return group_size, int8_default_group_size(model, scheme)
    return group_size, int8_group_size


def check_group_size_fits(
    model: nn.Module, scheme: str, group_size: int | None = None, int8_group_size: int | None = None
) -> None:
    """Refuse, before anything changes, a group size that some layer's input width does not divide (int4
    layers: ``group_size``; int8 layers: see :func:`group_sizes`)."""
    int4, int8 = group_sizes(scheme, group_size, int8_group_size)  # the values themselves, whatever the layers
    for name in _float_linears(model):
        module = model.get_submodule(name)
        n_in = cast(torch.Tensor, module.weight).shape[1]
        if scheme == "int4" and _takes_int4(model, module):
            check_group_size(int4, n_in, where=f"layer {name}")
        elif int8:
            check_int8_group_size(int8, n_in, where=f"layer {name}")


def quantized_layers(model: nn.Module) -> list[Int8Linear | Int4Linear]:
    """The model's int8 and int4 layers, each once."""
    return [module for module in model.modules() if isinstance(module, QUANTIZED)]


def set_activations(model: nn.Module, activations: str) -> nn.Module:
    """Make the int8 and int4 layers of ``model`` keep their inputs in float ("float", weight-only) or round them
    to int8 too: "int8" (W8A8, W4A8; W_2 and W_U round them twice) or "int8x2" (all twice); see
    :mod:`qkv.quantization.activation_modes`. The weights are untouched. Returns the model."""
    check_activations(activations)
    layers = quantized_layers(model)
    for layer, mode in zip(layers, layer_modes(model, activations, layers), strict=True):
        layer.activations = mode
    model.__dict__.pop("_fast_step", None)  # its stacked W_q/W_k/W_v copies were made in the old mode
    return model


def quantize_model(
    model: nn.Module,
    scheme: str = "int8",
    *,
    calibration: Callable[[nn.Module], object] | None = None,
    activations: str = "float",
    group_size: int | None = None,
    int8_group_size: int | None = None,
    smoothing: Callable[[nn.Module], object] | None = None,
    progress: Progress | None = None,
) -> nn.Module:
    """Quantize every linear layer and the unembedding of ``model`` in place (see the module docstring).

    ``calibration``, if given, is called once with the float model (in eval mode, without gradients) and
    must run its own forward on sample inputs; the rounding then minimises each layer's output error on them
    (:mod:`qkv.gptq`). Layers it never reaches are rounded to nearest. Returns the model, in eval mode: a
    quantized model is for inference, never trained. A model that is already quantized is returned as it is.
    ``activations`` is passed to :func:`set_activations`. ``group_size`` is the scheme's: int4's (32, the
    default, 64, 128 or 256), or int8's (0: a scale per output row; else a multiple of 32), dividing the input
    width of every layer it applies to; ``int8_group_size`` is the int4 scheme's int8 layers' (the unembedding).
    Where no int8 size is given, it is 32 if every int8 layer's width is a multiple of 32, else 0
    (:func:`int8_default_group_size`). ``smoothing``, a feed like ``calibration``, first moves the large input
    channels into the weights (SmoothQuant, :mod:`qkv.quantization.smoothing`), for int8 activations over int8
    weights; int4 weights are left as they are (their 16 levels cannot take the inputs' range). ``progress(what,
    done, total)``, if given, is told of each stage ("smoothing" the inputs, "calibrating" on the feed, "rounding"
    the layers) as it goes, for a progress bar: GPTQ on a large model takes minutes.
    """
    check_scheme(scheme)
    check_activations(activations)
    group_size, int8_group_size = _with_default_int8(model, scheme, group_size, int8_group_size)
    check_group_size_fits(model, scheme, group_size, int8_group_size)
    int4, int8 = group_sizes(scheme, group_size, int8_group_size)
    names = _float_linears(model)
    if smoothing is not None and names and scheme == "int8":  # int4's 16 levels cannot take the inputs' range
        strengths = smooth_model(model, smoothing, group_size=int8, progress=progress)
        model.__dict__["smoothed_inputs"] = sum(alpha > 0 for alpha in strengths.values())  # quantization.json says
    if calibration is not None and names and progress is not None:
        progress("calibrating", 0, 1)
    hessians = input_hessians(model.eval(), names, calibration) if calibration is not None and names else {}
    with torch.no_grad():
        for done, name in enumerate(names):
            if progress is not None:
                progress("rounding", done, len(names))
            hessian = hessians.pop(name, None)
            _quantize_module(
                model, name, empty=False, hessian=hessian, scheme=scheme, group_size=int4, int8_group_size=int8
            )
    if progress is not None and names:
        progress("rounding", len(names), len(names))
    return set_activations(model, activations).eval()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(module, QUANTIZED) for module in model.modules())


def quantization_scheme(model: nn.Module) -> str | None:
    """The scheme of the model's quantized layers ("int4" if any is int4, else "int8"), or None for a float model."""
    if any(isinstance(module, Int4Linear) for module in model.modules()):
        return "int4"
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
