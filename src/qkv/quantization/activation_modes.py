"""A model's activation mode, and what it makes of each quantized layer's.

Each int8 and int4 layer multiplies its input x as it is ("float": weight-only), rounded to int8 in blocks of 32
once ("int8": W8A8, W4A8) or twice ("int8x2"; :mod:`qkv.quantization.activation_blocks`). A model's mode, the one
``qkv quantize --activations``, ``qkv.load(..., activations=)`` and quantization.json name, sets its layers':

- "float": every layer keeps x float;
- "int8x2": every layer rounds x twice;
- "int8": every layer rounds x once, but for two kinds whose inputs one rounding serves worst, which round it
  twice (:data:`ROUNDED_TWICE_UNDER_INT8`):

  - W_2, the feed-forward's second layer. Its input is act(x W_1) (times x W_g where gated): products whose
    few large values set a block's scale d = max / 127 and leave the rest of the block a few levels each;
  - W_U, the unembedding. Its error moves all the logits at once, and decoding reads their order.

  llama.cpp's mixed formats keep the same two (``output`` and ``ffn_down``) at more bits than the rest. On
  SmolLM2-135M this takes W8A8's and W4A8's agreement with the float model past 97% (docs/generation.md), for
  W_2 and W_U's share of the integer products: about 40% of the weights rounded twice.

A layer's own mode can be set by hand (``layer.activations = "int8"``); a model whose layers then match none of
the three modes cannot be described by quantization.json, which says so (:func:`model_activations`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from qkv.layers.blocks import block_parts
from qkv.models.family import family_of

ROUNDED_TWICE_UNDER_INT8 = "W_2 (the feed-forward's second layer) and W_U (the unembedding)"
MODE_NOTES = {
    "float": "",
    "int8": ", int8 activations (W_2's and W_U's rounded twice)",
    "int8x2": ", int8 activations rounded twice",
}
"""What a command says of a model's mode after its size."""


def _rounded_twice_under_int8(model: nn.Module) -> set[int]:
    """ids of the layers the "int8" mode rounds twice: the W_2 of each block's feed-forward part (the blocks its
    family's description names), and W_U where the family has one (its description names the module)."""
    family = family_of(model)
    chosen = {id(inner.linear2) for block in family.blocks(model) for part, _, inner in block_parts(block)
              if part.kind == "mlp"}  # fmt: skip
    return chosen | ({id(model.get_submodule(family.unembedding))} if family.unembedding else set())


def layer_modes(model: nn.Module, activations: str, layers: Sequence[nn.Module]) -> list[str]:
    """The mode each of ``layers`` (quantized layers of ``model``) takes under the model's mode ``activations``."""
    if activations != "int8":
        return [activations] * len(layers)
    twice = _rounded_twice_under_int8(model)
    return ["int8x2" if id(layer) in twice else "int8" for layer in layers]


def model_activations(model: nn.Module, layers: Sequence[nn.Module], modes: Sequence[str]) -> str | None:
    """The model's mode (one of ``modes``) that gives each of ``layers`` the mode it has; None if no one does."""
    have = [str(layer.activations) for layer in layers]
    return next((mode for mode in modes if layer_modes(model, mode, layers) == have), None)
