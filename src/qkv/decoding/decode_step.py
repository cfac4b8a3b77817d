"""One decoding step with fixed shapes: the next-token logits of B rows that each feed one new token.

The model's own forward (``model(ids, cache=...)``) is the reference: it takes any number of new tokens,
records every intermediate for :mod:`qkv.inspect`, and its shapes grow with the sequence. Decoding calls
one step per token, so this module computes the same numbers with as little as possible around the
matrix products, and with the same shapes at every position:

- the position p of the new token is a tensor (1,), not a Python number: positional rows, rotary angles
  and the cache write are indexed by it, so ``torch.compile`` makes one graph for every position, and a
  CUDA graph can replay it;
- or a tensor (B,) of one position per row, for continuous batching (:mod:`qkv.decoding.engine`), where
  the rows are different requests at different points of their text: each row gets its own positional
  row and rotary angles, its key and value are written at its own position (one ``index_put_``), and the
  mask ``key position <= p[row]`` hides what lies past it (the row's own future, or a previous request's
  leftovers in the same cache row), and, for a model with a sliding window (Mistral), what lies more than
  ``window`` positions behind it: one :func:`qkv.layers.attention.attention_mask` for the model and the step;
- x stays (B, d_model): no time axis to add and remove;
- W_q, W_k, W_v run as one product (:func:`qkv.layers.fused.fuse_linears`) of width d_model + 2 h_kv d_k,
  whose output holds q, then k and v, head by head: its last 2 h_kv d_k values, viewed as
  (B, 2, h_kv, 1, d_k), are written into the cache (:meth:`qkv.layers.kv_cache.KVCache.allocate`, laid
  out (B, 2, h_kv, L, d_k) per layer) with one ``index_put_`` (:func:`write_kv`), no reshape or transpose; given
  the whole pool instead (:class:`PoolLayer`, as :class:`qkv.decoding.fast_step.FastStep` gives it), into the pool
  itself, which ``torch.compile`` does in place (a write through a layer's view made it copy the pool);
- with grouped-query attention (h_kv < h key/value heads) q is viewed as (B, h_kv, h / h_kv, d_k): the
  query heads that share a key/value head become that head's h / h_kv "positions", so one ordinary
  attention call serves them all and no key or value is copied per query head;
- attention reads the cache's first ``n_keys`` positions when that number is known in Python (eager
  decoding, no mask), or all L positions with the mask ``key position <= p`` built from the tensor (the
  compiled step: positions past p hold zeros and get weight exactly 0);
- the heads' output (B, h_kv, h / h_kv, d_k) is already laid out as their concatenation, (B, d_model);
- the encoder's keys and values (cross-attention) are computed once per source sentence, and the beams of
  a sentence attend to them as ``group`` queries of that one sentence: (B, h, group, d_k), never copied
  per beam.

Every other piece is the model's own module, called as the model calls it (LayerNorms or RMSNorms, the
feed-forward plain or gated, out_proj, embeddings, unembedding), so a module replaced by another with the same
call signature (an int8 linear) is used here too. Dropout is left out: decoding runs in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.layers.attention import MultiHeadAttention, attention_mask, grouped_sdpa
from qkv.layers.blocks import DecoderBlock, ResidualSublayer
from qkv.layers.embedding import InputEmbedding
from qkv.layers.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding, apply_rotary
from qkv.layers.stacks import DecoderStack
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer


@dataclass
class CrossAttention:
    """The encoder's keys and values for every decoder block, computed once per batch of source sentences.

    ``keys[i]`` and ``values[i]`` are (B_src, h_kv, S, d_k); ``mask`` (B_src, 1, 1, S) is True where a source
    position may be attended to (None: all may); ``group`` decoder rows (beams) belong to each sentence.
    ``empty`` (B_src, 1, 1, 1) marks sentences with no position to attend to (their attention output is 0,
    as in :func:`qkv.layers.attention.scaled_dot_product_attention`), None when there are none.
    """

    keys: Sequence[Tensor]
    values: Sequence[Tensor]
    mask: Tensor | None
    group: int = 1
    empty: Tensor | None = None


def cross_attention_keys(
    model: Transformer,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    *,
    group: int = 1,
    pad_to: int | None = None,
    fixed: bool = False,
) -> CrossAttention:
    """K = memory W_k and V = memory W_v of every decoder block, (B_src, h_kv, S, d_k) each, for ``memory``
    (B_src, S, d_model). ``pad_to`` appends masked zero positions up to that length; ``fixed`` makes the
    mask and ``empty`` tensors even when nothing is masked (one graph for every batch)."""
    keys, values = [], []
    for block in decoder_blocks(model.decoder):
        attn = block.cross_attn
        assert attn is not None, "an encoder-decoder's decoder blocks have cross-attention"
        keys.append(attn.split_heads(attn.key(memory)))  # (B, h_kv, S, d_k)
        values.append(attn.split_heads(attn.value(memory)))
    batch, length = memory.shape[:2]
    padding = None if memory_padding_mask is None else memory_padding_mask.bool()
    if padding is None and fixed:
        padding = torch.zeros(batch, length, dtype=torch.bool, device=memory.device)
    if pad_to is not None and pad_to > length:
        extra = pad_to - length
        keys = [F.pad(k, (0, 0, 0, extra)) for k in keys]
        values = [F.pad(v, (0, 0, 0, extra)) for v in values]
        if padding is None:
            padding = torch.zeros(batch, length, dtype=torch.bool, device=memory.device)
        padding = F.pad(padding, (0, extra), value=True)
    mask = None if padding is None else ~padding[:, None, None, :]  # (B, 1, 1, S): True = may attend
    empty = None if mask is None else ~mask.any(dim=-1, keepdim=True)  # (B, 1, 1, 1)
    if empty is not None and not fixed and not bool(empty.any()):
        empty = None
    return CrossAttention(keys, values, mask, group, empty)


def embed_step(embedding: InputEmbedding, token_ids: Tensor, position: Tensor) -> Tensor:
    """W_E rows of ``token_ids`` (B,) plus the positional rows of ``position`` (1,) or (B,): (B, d_model)."""
    x = embedding.token_embedding(token_ids)  # (B, d_model)
    positional = cast("SinusoidalPositionalEncoding | LearnedPositionalEncoding | None", embedding.positional_encoding)
    if positional is not None:
        x = x + positional.at(position)  # (1 or B, d_model), broadcast over B
    return x


class PoolLayer(NamedTuple):
    """Layer ``layer`` of the whole KV pool (n_layers, B, 2, h_kv, L, d_k), written through the pool itself."""

    pool: Tensor
    layer: int


def self_attention_step(
    h: Tensor,
    attn: MultiHeadAttention,
    projection: nn.Module,
    kv: Tensor | PoolLayer,
    position: Tensor,
    n_keys: int | None,
    mask: Tensor | None,
    rotary: tuple[Tensor, Tensor] | None,
) -> Tensor:
    """Causal self-attention of one new token per row. ``h`` (B, d_model); ``kv`` (B, 2, h_kv, L, d_k) is
    this layer's cache, or a :class:`PoolLayer` of the whole pool, written at ``position`` (1,) or at each row's
    own position (B,); ``projection`` computes [q, k, v] in one product; ``rotary`` is
    (cos, sin), each (1 or B, 1, 1, d_k)."""
    batch, d_model = h.shape[0], attn.d_model
    qkv = projection(h)  # (B, d_model + 2 h_kv d_k)
    q = qkv[:, :d_model].view(batch, attn.n_kv_heads, attn.group, attn.head_dim)  # (B, h_kv, h / h_kv, d_k)
    new_kv = qkv[:, d_model:].view(batch, 2, attn.n_kv_heads, 1, attn.head_dim)  # (B, 2, h_kv, 1, d_k)
    keys = new_kv[:, 0] if rotary is None else apply_rotary(new_kv[:, 0], *rotary)  # (B, h_kv, 1, d_k)
    if rotary is not None:
        q = apply_rotary(q, *rotary)  # every query head of the token at p: the same angles
    layer = kv.layer if isinstance(kv, PoolLayer) else None
    cache = kv.pool if isinstance(kv, PoolLayer) else kv
    write_kv(cache, layer, position, keys[:, :, 0], new_kv[:, 1, :, 0])
    kv = cache if layer is None else cache[layer]
    keys, values = (kv if n_keys is None else kv[:, :, :, :n_keys]).unbind(1)  # (B, h_kv, L or n_keys, d_k)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # (B, h_kv, h / h_kv, d_k)
    return attn.out_proj(out.reshape(batch, d_model))  # heads side by side: (B, d_model)


def write_kv(cache: Tensor, layer: int | None, position: Tensor, keys: Tensor, values: Tensor) -> None:
    """cache[b, :, :, p[b]] = (key, value) of row b, (B, h_kv, d_k) each, at ``position`` (1,) shared or (B,) one
    per row, by one ``index_put_``: into a layer's cache (B, 2, h_kv, L, d_k), or (``layer`` given) into the whole
    pool (n_layers, B, 2, h_kv, L, d_k) with the layer as an index tensor too. Under ``torch.compile`` a write
    through a view of a graph input (``pool[layer]``) becomes a copy of the whole pool (functionalization rebuilds
    the base from the written view), 30 layers x 30 copies of SmolLM2's pool a step; a write into the input itself
    is done in place. In eager mode both cost what ``index_copy_`` does."""
    rows = torch.arange(keys.shape[0], device=cache.device)
    where: tuple[Tensor | slice, ...] = (rows, slice(None), slice(None), position)  # broadcast to (B,)
    if layer is not None:
        where = (torch.full((1,), layer, dtype=torch.long, device=cache.device), *where)
    cache[where] = torch.stack((keys, values), 1)  # (B, 2, h_kv, d_k)


def cross_attention_step(
    h: Tensor, attn: MultiHeadAttention, keys: Tensor, values: Tensor, cross: CrossAttention
) -> Tensor:
    """Attention from the decoder rows ``h`` (B_src * group, d_model) to their sentence's encoder output."""
    rows = h.shape[0]
    q = attn.query(h).view(rows // cross.group, cross.group, attn.n_heads, attn.head_dim).transpose(1, 2)
    out = grouped_sdpa(q, keys, values, attn_mask=cross.mask)  # (B_src, h, group, d_k)
    if cross.empty is not None:
        out = out.masked_fill(cross.empty, 0.0)
    return attn.out_proj(out.transpose(1, 2).reshape(rows, attn.d_model))  # (B_src * group, d_model)


def residual(sublayer: ResidualSublayer, x: Tensor, fn: Callable[..., Tensor], *args: object) -> Tensor:
    """x + fn(norm(x)) (pre-LN) or norm(x + fn(x)) (post-LN), as ResidualSublayer (no dropout)."""
    if sublayer.norm_first:
        return x + fn(sublayer.norm(x), *args)
    return sublayer.norm(x + fn(x, *args))


def decoder_stack_step(
    stack: DecoderStack,
    projections: Sequence[nn.Module],
    x: Tensor,
    kv: Sequence[Tensor] | Tensor,
    position: Tensor,
    n_keys: int | None,
    rotary: tuple[Tensor, Tensor] | None,
    cross: CrossAttention | None,
) -> Tensor:
    """The decoder blocks and the final norm for one token per row: (B, d_model) -> (B, d_model). ``kv``: each
    layer's cache, or the whole pool (n_layers, B, 2, h_kv, L, d_k), each layer written through it."""
    masks: dict[int | None, Tensor | None] = {}  # one per attention window (None: plain causal)
    pool = kv if isinstance(kv, Tensor) else None  # the whole pool (n_layers, B, 2, h_kv, L, d_k)
    for i, block in enumerate(decoder_blocks(stack)):
        window = block.self_attn.window
        if window not in masks:
            masks[window] = _step_mask(kv[i].shape[3] if n_keys is None else n_keys, position, window, n_keys)
        x = residual(
            block.self_attn_sublayer,
            x,
            self_attention_step,
            block.self_attn,
            projections[i],
            kv[i] if pool is None else PoolLayer(pool, i),
            position,
            n_keys,
            masks[window],
            rotary,
        )
        if block.cross_attn is not None:
            assert cross is not None, "a decoder with cross-attention needs the encoder's keys and values"
            assert block.cross_attn_sublayer is not None, "cross-attention comes with its residual sublayer"
            x = residual(
                block.cross_attn_sublayer,
                x,
                cross_attention_step,
                block.cross_attn,
                cross.keys[i],
                cross.values[i],
                cross,
            )
        x = residual(block.ffn_sublayer, x, block.feed_forward)
    return stack.final_norm(x)


def decoder_blocks(stack: DecoderStack) -> Sequence[DecoderBlock]:
    """The stack's blocks as what they are: ``nn.ModuleList`` gives the type checker plain Modules."""
    return cast("Sequence[DecoderBlock]", stack.blocks)


def _step_mask(length: int, position: Tensor, window: int | None, n_keys: int | None) -> Tensor | None:
    """Which of the ``length`` cached keys each new token may see, (1 or B, 1, 1, length): those at or before its
    position p (the rest are another text's leftovers, or zeros), and within its sliding ``window``. None when
    every key read may be seen (eager decoding at one shared position, reading exactly p + 1 keys, no window)."""
    if window is None and n_keys is not None and position.numel() == 1:
        return None
    return attention_mask(1, length, causal=True, window=window, query_positions=position[:, None])


def _rotary(model: GPT | Transformer, position: Tensor) -> tuple[Tensor, Tensor] | None:
    """RoPE's (cos, sin) at ``position``, (1 or B, 1, 1, d_k) each: per row, shared by its heads."""
    if model.rotary is None:
        return None
    cos, sin = model.rotary.at(position)  # (1 or B, d_k)
    return cos[:, None, None, :], sin[:, None, None, :]


def gpt_step(
    model: GPT,
    projections: Sequence[nn.Module],
    token_ids: Tensor,
    position: Tensor,
    kv: Sequence[Tensor] | Tensor,
    n_keys: int | None = None,
) -> Tensor:
    """Next-token logits (B, vocab_size) of a GPT for new tokens (B,) at ``position`` (1,), or each row at
    its own position (B,); ``n_keys`` (each row's position + 1 at most) bounds the keys read."""
    x = embed_step(model.embedding, token_ids, position)  # (B, d_model)
    rotary = _rotary(model, position)
    x = decoder_stack_step(model.decoder, projections, x, kv, position, n_keys, rotary, None)
    return model.unembedding(x)  # (B, vocab_size)


def transformer_step(
    model: Transformer,
    projections: Sequence[nn.Module],
    token_ids: Tensor,
    position: Tensor,
    kv: Sequence[Tensor] | Tensor,
    cross: CrossAttention,
    n_keys: int | None = None,
) -> Tensor:
    """Next-token logits (B, tgt_vocab_size) of an encoder-decoder for new target tokens (B,)."""
    x = embed_step(model.tgt_embedding, token_ids, position)
    rotary = _rotary(model, position)
    x = decoder_stack_step(model.decoder, projections, x, kv, position, n_keys, rotary, cross)
    return model.unembedding(x)
