"""The token-wise feed-forward network, plain or gated.

Applied to every position separately and identically (the notes on the mathematics of attention:
"implemented token-wise"). The paper's :class:`FeedForward` is

    FFN(x) = act(x W_1 + b_1) W_2 + b_2

with ReLU and an inner width d_ff = 4 d_model (2048 for d_model = 512); GPT-2 uses GELU.
:class:`GatedFeedForward` is the gated linear unit variant (Shazeer 2020, "GLU Variants Improve
Transformer") that Llama, Qwen2 and SmolLM use:

    FFN(x) = W_2 (act(W_g x) * W_1 x)

a second projection W_g of the same width gates the first element by element; with act = silu it is
SwiGLU (with GELU, GEGLU). Three matrices instead of two, so d_ff is usually 8/3 d_model to keep the
parameter count (:func:`qkv.models.config.glu_width`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from qkv.layers.dropout import dropout_layer
from qkv.layers.linear import Linear
from qkv.native import swiglu as native_swiglu

ACTIVATION_FUNCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),  # squared ReLU (So et al. 2021, "Primer")
}


class FeedForward(nn.Module):
    """Expand to d_ff, apply the non-linearity, project back to d_model."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "gelu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.linear1 = Linear(d_model, d_ff, bias=bias)  # W_1
        self.linear2 = Linear(d_ff, d_model, bias=bias)  # W_2
        self.activation = ACTIVATION_FUNCTIONS[activation]
        self.dropout = dropout_layer(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (B, T, d_model)


class GatedFeedForward(nn.Module):
    """W_2 (act(W_g x) * W_1 x): ``gate`` is W_g (Hugging Face's gate_proj), ``linear1`` W_1 (up_proj),
    ``linear2`` W_2 (down_proj). Dropout, if any, acts on the gated product, as in :class:`FeedForward`."""

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "silu", dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.gate = Linear(d_model, d_ff, bias=bias)  # W_g
        self.linear1 = Linear(d_model, d_ff, bias=bias)  # W_1
        self.linear2 = Linear(d_ff, d_model, bias=bias)  # W_2
        self.activation = ACTIVATION_FUNCTIONS[activation]
        self.swiglu = activation == "silu"
        self.dropout = dropout_layer(dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate(x), self.linear1(x)
        if self.swiglu and native_swiglu.applies(gate, up):  # float32 on a CPU: one pass in C each way
            hidden = native_swiglu.swiglu(gate, up)
        else:
            hidden = self.activation(gate) * up  # (B, T, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, T, d_model)
