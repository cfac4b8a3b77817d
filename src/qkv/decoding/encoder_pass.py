"""The encoder's forward pass for inference (sentence embeddings): the model's numbers with less around them.

:class:`qkv.models.encoder.Encoder`'s forward is the reference. For embedding sentences nothing needs to be
recorded and nothing is trained, so this pass differs in two ways only:

- W_q, W_k and W_v run as one product (:func:`qkv.layers.fused.fuse_linears`), whose output holds q, k
  and v side by side, each (B, h or h_kv, T, d_k) by a split and a permutation of axes (no copy);
- the zeroing of attention rows with no key to attend to (a sequence made only of padding) is done only
  when such a row exists, which is checked once per batch rather than in every layer (under
  ``torch.compile`` it is always done: the check would read a tensor in Python, a graph break).

Everything else is the model's own modules, called as the model calls them (embeddings, LayerNorms, the
feed-forward network, out_proj), so a Linear replaced by another module (an int8 linear) is used here too.
Dropout is left out: this runs in eval mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor, nn

from qkv.decoding.decode_step import residual
from qkv.layers.attention import MultiHeadAttention, grouped_sdpa
from qkv.layers.blocks import EncoderBlock
from qkv.layers.positional import apply_rotary
from qkv.models.encoder import Encoder


def self_attention(
    h: Tensor,
    attn: MultiHeadAttention,
    projection: nn.Module,
    mask: Tensor | None,
    empty: Tensor | None,
    rotary: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """Bidirectional self-attention of ``h`` (B, T, d_model); ``mask`` (B, 1, 1, T) True where a key may be
    attended to; ``empty`` (B, 1, 1, 1) marks sequences with no such key (None: there are none)."""
    batch, length, _ = h.shape
    widths = [attn.d_model, attn.kv_dim, attn.kv_dim]
    q, k, v = (attn.split_heads(t) for t in projection(h).split(widths, dim=-1))  # (B, h or h_kv, T, d_k)
    if rotary is not None:
        q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
    out = grouped_sdpa(q, k, v, attn_mask=mask)  # (B, h, T, d_k)
    if empty is not None:
        out = out.masked_fill(empty, 0.0)
    return attn.out_proj(out.transpose(1, 2).reshape(batch, length, attn.d_model))  # (B, T, d_model)


def encoder_hidden(
    model: Encoder, projections: Sequence[nn.Module], token_ids: Tensor, padding_mask: Tensor | None = None
) -> Tensor:
    """Contextual vectors (B, T, d_model) for ``token_ids`` (B, T), as ``model(token_ids, padding_mask=...)``."""
    length = token_ids.shape[1]
    model.check_length(length, fix="shorten the input")
    x = model.embedding(token_ids)  # (B, T, d_model)
    if model.token_type_embedding is not None:
        x = x + model.token_type_embedding(torch.zeros_like(token_ids))
    if model.embedding_norm is not None:
        x = model.embedding_norm(x)
    mask = empty = None
    if padding_mask is not None:
        mask = ~padding_mask.bool()[:, None, None, :]  # (B, 1, 1, T)
        empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1, 1, 1)
        if not torch.compiler.is_compiling() and not bool(empty.any()):  # compiled: always mask, no break
            empty = None
    rotary = model.rotary_angles(length)
    blocks = cast("Sequence[EncoderBlock]", model.encoder.blocks)  # an nn.ModuleList: plain Modules to the checker
    for block, projection in zip(blocks, projections, strict=True):
        x = residual(block.attn_sublayer, x, self_attention, block.self_attn, projection, mask, empty, rotary)
        x = residual(block.ffn_sublayer, x, block.feed_forward)
    return model.encoder.final_norm(x)
