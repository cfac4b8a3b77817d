"""The quantized folder's description: ``quantization.json`` says which layers of the model hold int8 or int4 weights.

A model folder (:mod:`qkv.model_dir`) of a quantized model holds, beside config.json and the tokenizers,
``model.safetensors`` with ``qweight`` (int8) and ``weight_scale`` in place of each int8 layer's ``weight``,
and this description::

    {"format": "qkv-quantized", "version": 1, "scheme": "int8", "description": "...", "activations": "float",
     "modules": ["decoder.blocks.0.self_attn.query", ..., "unembedding"]}

``activations`` is how the int8 layers treat their inputs: "float" (weight-only), "int8" (quantized per
vector too, :mod:`qkv.quantization.dynamic`) or "int8x2" (rounded twice, :mod:`qkv.quantization.activation_blocks`);
a description without it (older folders) means "float".

An int4 model (scheme "int4") stores ``qweight`` (two levels a byte), ``weight_scale`` and ``weight_min``
(float16, one per group) for each int4 layer; its description adds the group size and lists the layers kept
at int8 (the unembedding) apart::

    {..., "scheme": "int4", "group_size": 32, "modules": [...int4 layers...], "int8_modules": ["unembedding"]}

Int8 layers with a scale per group of weights (``Int8Linear.group_size``, GGUF's Q8_0 for 32) store
``weight_scale`` as (N, K / g) and add their group size, for the int8 scheme's layers and int4's int8_modules
alike (one size for all of a model's int8 layers)::

    {..., "scheme": "int8", "int8_group_size": 32, "modules": [...]}

Without ``int8_group_size`` (older folders) the int8 layers have one scale per output row.

A model whose inputs were smoothed before int8 activations (:mod:`qkv.quantization.smoothing`) says how many of
its layers' inputs had channels moved into the weights (the weights carry it: loading needs nothing more)::

    {..., "activations": "int8", "smoothed_inputs": 118}

:func:`quantization_info` writes it for a quantized model; :func:`apply_quantization` gives a freshly built
float model the int8 and int4 layers it names, so that their weights load into it without the original model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qkv.errors import QkvError
from qkv.quantization.activation_modes import model_activations
from qkv.quantization.int4_linear import GROUP_SIZE, Int4Linear
from qkv.quantization.int8_linear import ACTIVATIONS, Int8Linear
from qkv.quantization.int8_linear import check_group_size as check_int8_group_size
from qkv.quantization.model import SCHEMES, _quantize_module, description, set_activations

FORMAT = "qkv-quantized"
FORMAT_VERSION = 1


def quantization_info(model: nn.Module) -> dict[str, Any] | None:
    """What ``quantization.json`` holds for ``model`` (None when it has no quantized layer)."""
    int8 = {name: module for name, module in model.named_modules() if isinstance(module, Int8Linear)}
    int4 = {name: module for name, module in model.named_modules() if isinstance(module, Int4Linear)}
    if not int8 and not int4:
        return None
    scheme = "int4" if int4 else "int8"
    activations = model_activations(model, [*int8.values(), *int4.values()], ACTIVATIONS)
    if activations is None:
        raise QkvError(
            "the model's layers treat their inputs in a mix that no activation mode describes, so quantization.json "
            "cannot: call qkv.quantization.set_activations(model, 'float', 'int8' or 'int8x2') before saving"
        )
    groups = {module.group_size for module in int8.values()}
    if len(groups) > 1:
        raise QkvError(
            f"the model's int8 layers mix scales per row and per group ({sorted(groups)}), which quantization.json "
            "cannot describe: quantize it again with one group size"
        )
    int8_group_size = groups.pop() if groups else 0
    info: dict[str, Any] = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "scheme": scheme,
        "description": description(scheme, activations, int8_group_size),
        "activations": activations,
        "modules": list(int4 or int8),
    }
    if int8_group_size:
        info["int8_group_size"] = int8_group_size
    smoothed = getattr(model, "smoothed_inputs", 0)  # set by quantize_model(..., smoothing=)
    if smoothed:
        info["smoothed_inputs"] = smoothed
    if int4:
        sizes = {module.group_size for module in int4.values()}
        if len(sizes) > 1:
            raise QkvError(f"the model's int4 layers have groups of {sorted(sizes)} weights; quantize it again")
        info.update(group_size=sizes.pop(), int8_modules=list(int8))
    return info


def apply_quantization(model: nn.Module, info: Any, where: str = "quantization.json") -> nn.Module:
    """Give a freshly built float ``model`` the int8 and int4 layers ``info`` describes, ready to load their weights."""
    if not isinstance(info, dict) or info.get("format") != FORMAT or not isinstance(info.get("modules"), list):
        raise QkvError(f"{where} is not a qkv quantization description: restore it, or quantize the run again")
    if info.get("version", FORMAT_VERSION) > FORMAT_VERSION or info.get("scheme") not in SCHEMES:
        raise QkvError(
            f"{where} describes {info.get('scheme')!r} weights (format version {info.get('version')}), which this "
            "qkv cannot read: upgrade qkv, or quantize the original run with this version"
        )
    scheme, group_size = info["scheme"], info.get("group_size", GROUP_SIZE)
    int8_modules = info.get("int8_modules", []) if scheme == "int4" else []
    int8_group_size = info.get("int8_group_size", 0)
    if not isinstance(group_size, int) or not isinstance(int8_modules, list):
        raise QkvError(f"{where} is not a qkv quantization description: restore it, or quantize the run again")
    try:
        check_int8_group_size(int8_group_size)
    except QkvError:
        raise QkvError(
            f"{where} says int8_group_size {int8_group_size!r}, which is not a multiple of 32: fix the file, or "
            "quantize the original run again"
        ) from None
    layers = [(name, scheme) for name in info["modules"]] + [(name, "int8") for name in int8_modules]
    with torch.no_grad():
        for name, kind in layers:
            try:
                _quantize_module(
                    model, name, empty=True, scheme=kind, group_size=group_size, int8_group_size=int8_group_size
                )
            except AttributeError:
                raise QkvError(
                    f"{where} names a layer {name} that the model in config.json does not have: "
                    "the files come from different runs; quantize the original run again"
                ) from None
    smoothed = info.get("smoothed_inputs", 0)
    if isinstance(smoothed, int) and smoothed > 0:
        model.__dict__["smoothed_inputs"] = smoothed  # kept if the model is saved again
    activations = info.get("activations", "float")
    if activations not in ACTIVATIONS:
        raise QkvError(
            f"{where} says activations {activations!r}; this qkv knows {', '.join(ACTIVATIONS)}: fix the "
            "file, or quantize the original run again"
        )
    return set_activations(model, activations).eval()
