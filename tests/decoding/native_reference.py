"""What the native step's tests share: the models that take every branch of the C step, the weight schemes, each
quantized layer's arithmetic in float64 to compare with, and the fixture that skips without the C kernels.
tests/decoding/test_native_step.py (the whole step), test_native_step_products.py (each product alone) and
test_native_step_parts.py (the parts around the products) use them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from qkv import native
from qkv.decoding.native_step import int8_in_bfloat16
from qkv.models import GPT, GPTConfig, LlamaConfig
from qkv.models.llama import Llama
from qkv.quantization import Int4Linear, Int8Linear, quantize_model, set_activations

BLOCK = 32

SMALL = dict(vocab_size=97, d_model=64, n_heads=4, n_layers=2, context_length=48, init_std=0.3)


def _small(family: type[nn.Module], config: type, **changes) -> nn.Module:
    """A two-block model of 64-wide vectors and 4 heads (``SMALL``), with ``changes``."""
    return family(config(**{**SMALL, **changes}))


MODELS = {  # every branch of the C step: norms, feed-forwards, RoPE or learned positions, biases, head widths
    "rope, gated": lambda: _small(Llama, LlamaConfig, n_kv_heads=2, d_ff=96, tie_embeddings=True),
    "qwen2, window": lambda: _small(Llama, LlamaConfig, n_kv_heads=1, d_ff=64, qkv_bias=True, sliding_window=5),
    "learned positions": lambda: _small(GPT, GPTConfig, d_ff=128),
    # W_E's rows times sqrt(d_model), looked up by the C step
    "rope, scaled embeddings": lambda: _small(GPT, GPTConfig, d_ff=128, positional="rope", scale_embeddings=True),
    "wide heads": lambda: _small(
        Llama, LlamaConfig, d_model=256, n_heads=2, n_kv_heads=1, d_ff=128, n_layers=1, init_std=0.1
    ),  # fmt: skip
}
SCHEMES = ("float32", "int8", "int8 activations", "int8 g32", "int8 activations g32", "int4", "int4 activations",
           "int8 twice", "int8 twice g32", "int4 twice")  # fmt: skip
ROUNDED = ("int8 activations", "int8 activations g32", "int4 activations", "int8 twice", "int8 twice g32",
           "int4 twice")  # fmt: skip  # the schemes that round x to int8 (once, or twice: activations int8x2)


def activations_of(kind: str) -> str:
    """The layers' activations in a scheme or kind named above: "twice" (int8x2), "activations" (int8), or float."""
    return "int8x2" if "twice" in kind else "int8" if "activations" in kind else "float"


@pytest.fixture(autouse=True)
def _library():
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")


def make(name: str, scheme: str) -> nn.Module:
    torch.manual_seed(3)
    model = MODELS[name]().eval()
    with torch.no_grad():  # norm gains and biases other than 1 and 0, so that one left out changes the numbers
        for param_name, p in model.named_parameters():
            if param_name.endswith(("norm.weight", "bias")):
                p.uniform_(0.5, 1.5)
    if scheme != "float32":
        if scheme.startswith("int4"):  # W_U (tied: W_E too) int8 with a scale per row; "int8 g32" has its groups
            quantize_model(model, "int4", int8_group_size=0)
        else:
            quantize_model(model, "int8", group_size=32 if "g32" in scheme else 0)
        set_activations(model, activations_of(scheme))
    return model


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 in blocks of 32 as the C step does (float32: the same ties), back in x's dtype."""
    blocks = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    top = blocks.abs().amax(-1, keepdim=True)
    levels = torch.round(blocks * torch.where(top > 0, 127 / top, torch.zeros_like(top)))
    return (levels * (top / 127)).reshape(x.shape).to(x.dtype)


def rounded_twice(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 blocks, plus what that missed (in float32, as the C step computes it) rounded on its block's
    step / 254."""
    blocks = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    top = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(top > 0, 127 / top, torch.zeros_like(top))
    once = torch.round(blocks * inverse) * (top / 127)
    missed = torch.round((blocks - once) * (inverse * 254)) * (top / 127 / 254)
    return (once.double() + missed.double()).reshape(x.shape).to(x.dtype)


class Reference(nn.Module):
    """A quantized layer's arithmetic in float64: its dequantized weights, and x rounded where the C step rounds it
    (int8 activations; for int4 its weights s q + m times the rounded x, as llama.cpp's Q4_1 x Q8_1 product; for
    int8 weights with float activations on a CPU with bfloat16 products, x in bfloat16, and with scales per group
    s Q in bfloat16 too)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer, self.weight = layer, layer.weight.double()
        self.bias = None if layer.bias is None else layer.bias.double()
        self.in_bfloat16 = isinstance(layer, Int8Linear) and int8_in_bfloat16(layer.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if self.layer.activations == "int8":
            x = rounded(x)
        elif self.layer.activations == "int8x2":
            x = rounded_twice(x)
        elif self.in_bfloat16:
            x = x.float().bfloat16().double()
            if self.layer.group_size:
                weight = self.layer.weight.float().bfloat16().double()
        y = x @ weight.T
        return y if self.bias is None else y + self.bias


def float64_reference(model: nn.Module) -> nn.Module:
    reference = copy.deepcopy(model)
    for module in list(reference.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (Int8Linear, Int4Linear)):
                setattr(module, child_name, Reference(child))
    return reference.double()
