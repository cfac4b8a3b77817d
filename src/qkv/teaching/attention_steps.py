"""Self-attention built up one step at a time, as in Raschka, ch. 3 (LLMs-from-scratch, chapter 3).

Each step is a function or module you can call on the seed's six-token example ("Your journey starts
with one step", embedded in 3 dimensions) and compare with the text:

1. :func:`attention_without_weights` (3.3.1): scores omega_ij = x_i . x_j, softmax rows into weights,
   context vectors z_i = sum_j alpha_ij x_j. No trainable weights. :func:`simple_normalize` and
   :func:`naive_softmax` are the two normalisations shown before ``torch.softmax``.
2. :class:`SelfAttentionV1` / :class:`SelfAttentionV2` (3.4): trainable W_query, W_key, W_value and
   scaling by sqrt(d_out): softmax(Q K^T / sqrt(d_k)) V.
3. :func:`causal_weights_renormalized` / :func:`causal_weights_masked` (3.5.1): two ways to hide the
   future, which give the same weights.
4. :class:`CausalAttention` (3.5.2-3.5.3): causal mask, dropout on the attention weights, batches.
5. :class:`MultiHeadAttentionWrapper` (3.6.1): several independent heads, concatenated, then W_o.
6. :func:`wrapper_to_multihead` (3.6.2): the same computation as qkv's weight-split
   :class:`~qkv.layers.attention.MultiHeadAttention`, which is what every qkv model uses.

The steps reuse the core functions of :mod:`qkv.layers.attention` (``attention_scores``,
``causal_mask``, ``masked_softmax``) wherever the math is the same, so there is one definition of
"scores", "causal" and "masked softmax" in qkv.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor, nn

from qkv.layers.attention import (
    MultiHeadAttention,
    attention_scores,
    causal_mask,
    masked_softmax,
    scaled_dot_product_attention,
)
from qkv.layers.capture import record

# --- 3.3.1: attention without trainable weights -------------------------------------------------------


def simple_normalize(scores: Tensor) -> Tensor:
    """The "simple way" of 3.3.1: divide each row of scores by its sum, so it sums to 1.

    Only meaningful for positive scores (a negative score gives a negative "weight"); the text moves on
    to the softmax, which handles any scores and has better gradients.
    """
    return scores / scores.sum(dim=-1, keepdim=True)


def naive_softmax(scores: Tensor) -> Tensor:
    """exp(x_i) / sum_j exp(x_j) written out, as in 3.3.1. Overflows for large scores (exp(1000) = inf).

    Use ``torch.softmax`` (or :func:`qkv.layers.softmax.softmax`), which subtracts the row maximum first.
    """
    exp = torch.exp(scores)
    return exp / exp.sum(dim=-1, keepdim=True)


def attention_without_weights(inputs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Section 3.3.1: every input attends to every input by plain dot products; no trainable weights.

    For inputs x (T, d) or (B, T, d) the query of token i is x_i itself, so

        omega = x x^T                       (attention scores, omega_ij = x_i . x_j)
        alpha = softmax_row(omega)          (attention weights, each row sums to 1)
        z     = alpha x                     (context vectors, z_i = sum_j alpha_ij x_j)

    Returns ``(scores, weights, context)`` with shapes (..., T, T), (..., T, T), (..., T, d). There is no
    1/sqrt(d) scaling here; it arrives with the trainable weights in section 3.4.
    """
    scores = attention_scores(inputs, inputs)  # (..., T, T)
    weights = masked_softmax(scores)  # (..., T, T)
    context = weights @ inputs  # (..., T, d)
    return scores, weights, context


# --- 3.4: trainable weights ----------------------------------------------------------------------------


class SelfAttentionV1(nn.Module):
    """Scaled dot-product self-attention with W_query, W_key, W_value as plain ``nn.Parameter`` matrices.

    Section 3.4.2: queries = x W_query, keys = x W_key, values = x W_value (each W is (d_in, d_out) and
    multiplies from the right), then

        context = softmax(queries keys^T / sqrt(d_out)) values

    The weights start as ``torch.rand`` like the seed (so ``torch.manual_seed(123)`` reproduces the
    book's numbers). Works on (T, d_in) or (B, T, d_in).
    """

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:
        keys = x @ self.W_key  # (..., T, d_out)
        queries = x @ self.W_query  # (..., T, d_out)
        values = x @ self.W_value  # (..., T, d_out)
        scores = attention_scores(queries, keys)  # (..., T, T), omega
        weights = masked_softmax(scores / keys.shape[-1] ** 0.5)  # (..., T, T), each row sums to 1
        return weights @ values  # (..., T, d_out)


class SelfAttentionV2(nn.Module):
    """:class:`SelfAttentionV1` with ``nn.Linear`` layers: same math, better initialisation, optional bias.

    ``nn.Linear`` stores its weight as (d_out, d_in) and computes x W^T, so ``W_query.weight.T`` here
    plays the role of V1's ``W_query``; copying the transposed weights into V1 gives identical outputs.
    The steps V1 spells out are exactly qkv's :func:`~qkv.layers.attention.scaled_dot_product_attention`
    (default scale 1 / sqrt(d_k), with d_k = d_out), so V2 calls it.
    """

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False) -> None:
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: Tensor) -> Tensor:
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)  # (..., T, d_out) each
        context, _ = scaled_dot_product_attention(queries, keys, values)  # softmax(Q K^T / sqrt(d_out)) V
        return context  # (..., T, d_out)


# --- 3.5.1: hiding future words --------------------------------------------------------------------------


def causal_weights_renormalized(scores: Tensor) -> Tensor:
    """The seed's first causal mask: softmax, zero the weights above the diagonal (tril), renormalise rows.

    ``scores`` (..., Tq, Tk) should already be scaled (omega / sqrt(d_k)). This gives exactly the same
    weights as :func:`causal_weights_masked`: the softmax denominator Z of a row is a common factor of
    every weight in it, so dividing by the sum of the kept weights cancels it,

        (e^{s_ij} / Z) / sum_{j' <= i} (e^{s_ij'} / Z) = e^{s_ij} / sum_{j' <= i} e^{s_ij'},

    which is the softmax over the visible scores alone. (The masked form is the one to use: here the
    future's scores still take part in the first softmax, and a future score much larger than the past
    ones drives the kept weights to 0 / 0.)
    """
    mask = causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device)  # (Tq, Tk), tril of ones
    weights = torch.softmax(scores, dim=-1) * mask  # zero above the diagonal; rows no longer sum to 1
    return weights / weights.sum(dim=-1, keepdim=True)


def causal_weights_masked(scores: Tensor) -> Tensor:
    """The seed's second causal mask: scores above the diagonal become -inf before the softmax.

    e^{-inf} = 0, so the future gets weight exactly 0 and each row is a softmax over the visible scores,
    equal to :func:`causal_weights_renormalized`. This is :func:`qkv.layers.attention.masked_softmax`
    with :func:`qkv.layers.attention.causal_mask`, the path every qkv model takes.
    """
    return masked_softmax(scores, causal_mask(scores.shape[-2], scores.shape[-1], device=scores.device))


# --- 3.5.3: a compact causal attention class ------------------------------------------------------------


class CausalAttention(nn.Module):
    """One causal self-attention head for batches (B, T, d_in) -> (B, T, d_out), section 3.5.3.

    softmax(mask(Q K^T) / sqrt(d_out)), then dropout on the attention weights (3.5.2: during training a
    fraction ``dropout`` of the weights is zeroed and the rest scaled by 1 / (1 - dropout)), times V.
    The causal mask for up to ``context_length`` tokens is a buffer (it moves with ``.to(device)`` and is
    not a parameter); it is boolean, True where attention is allowed, like every mask in qkv.
    """

    mask: Tensor  # (ctx, ctx) the buffer registered in __init__

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False) -> None:
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", causal_mask(context_length), persistent=False)  # (ctx, ctx)

    def attention_weights(self, x: Tensor) -> Tensor:
        """The (B, T, T) attention weights for ``x``, after dropout when the module is training."""
        n_tokens = x.shape[-2]
        if n_tokens > self.mask.shape[-1]:
            raise ValueError(f"{n_tokens} tokens exceed context_length={self.mask.shape[-1]}")
        keys = self.W_key(x)  # (B, T, d_out)
        queries = self.W_query(x)  # (B, T, d_out)
        scores = attention_scores(queries, keys)  # (B, T, T)
        weights = masked_softmax(scores / keys.shape[-1] ** 0.5, self.mask[:n_tokens, :n_tokens])  # (B, T, T)
        weights = record(self, "weights", weights)
        return self.dropout(weights)

    def forward(self, x: Tensor) -> Tensor:
        return self.attention_weights(x) @ self.W_value(x)  # (B, T, T) @ (B, T, d_out) -> (B, T, d_out)


# --- 3.6: multi-head attention ---------------------------------------------------------------------------


class MultiHeadAttentionWrapper(nn.Module):
    """``num_heads`` independent :class:`CausalAttention` heads side by side, section 3.6.1, plus W_o.

    Each head has its own W_query, W_key, W_value (d_in -> d_out); their outputs are concatenated along
    the last axis, giving num_heads * d_out features (2 heads of d_out = 2 give 4), which the output
    projection W_o (``out_proj``, a square ``nn.Linear`` with bias, as in the seed's 3.6.2 class) mixes.
    ``out_proj=False`` leaves it out, as the seed's 3.6.1 wrapper does.
    """

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        out_proj: bool = True,
    ) -> None:
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )
        self.out_proj = nn.Linear(num_heads * d_out, num_heads * d_out) if out_proj else None

    def forward(self, x: Tensor) -> Tensor:
        out = torch.cat([head(x) for head in self.heads], dim=-1)  # (B, T, num_heads * d_out)
        return out if self.out_proj is None else self.out_proj(out)


@torch.no_grad()
def wrapper_to_multihead(wrapper: MultiHeadAttentionWrapper) -> MultiHeadAttention:
    """A qkv :class:`~qkv.layers.attention.MultiHeadAttention` computing exactly what ``wrapper`` computes.

    Section 3.6.2 claims the weight-split class is "essentially a rewritten version" of the wrapper. The
    weight-split module has one (d_model, d_model) W_q whose output features h*d_k ... (h+1)*d_k belong to
    head h (that is what ``split_heads`` reads), so stacking the heads' W_query rows in order gives it,
    and likewise for W_k, W_v; W_o is copied as is (the identity when the wrapper has none). Called with
    ``causal=True`` and dropout off (``.eval()``), the two give the same outputs.

    Requires d_in == num_heads * d_out (= d_model): qkv's module maps d_model to d_model, while the
    wrapper may change the width. The biases follow the wrapper's: on W_q, W_k, W_v (``qkv_bias``) and on
    W_o (``bias``) separately, so the seed's default (a bias in W_o only) has no q/k/v biases here either.
    """
    heads = cast("list[CausalAttention]", list(wrapper.heads))  # the wrapper's ModuleList holds its heads
    n_heads, head_dim = len(heads), heads[0].d_out
    d_model = n_heads * head_dim
    d_in = heads[0].W_query.in_features
    if d_in != d_model:
        raise ValueError(f"MultiHeadAttention needs d_in == num_heads * d_out, got {d_in} != {n_heads}*{head_dim}")
    qkv_bias = heads[0].W_query.bias is not None
    out_bias = wrapper.out_proj is not None and wrapper.out_proj.bias is not None
    mha = MultiHeadAttention(d_model, n_heads, dropout=heads[0].dropout.p, bias=out_bias, qkv_bias=qkv_bias)
    mha.to(heads[0].W_query.weight)  # same dtype and device as the wrapper
    mha.train(wrapper.training)
    for ours, name in ((mha.query, "W_query"), (mha.key, "W_key"), (mha.value, "W_value")):
        per_head = [getattr(head, name) for head in heads]
        ours.weight.copy_(torch.cat([p.weight for p in per_head]))  # head h's rows h*d_k ... (h+1)*d_k
        if ours.bias is not None:
            ours.bias.copy_(torch.cat([p.bias for p in per_head]))
    if wrapper.out_proj is None:
        mha.out_proj.weight.copy_(torch.eye(d_model, dtype=mha.out_proj.weight.dtype))
    else:
        mha.out_proj.weight.copy_(wrapper.out_proj.weight)
    if mha.out_proj.bias is not None:
        assert wrapper.out_proj is not None  # out_bias: the wrapper's W_o has a bias
        mha.out_proj.bias.copy_(wrapper.out_proj.bias)
    return mha
