"""Scaled dot-product attention and multi-head attention: the one implementation every qkv model uses.

The recipe of the attention notes and Raschka, ch. 3: project each token vector x_i into a query q_i = x_i W_q, a key
k_i = x_i W_k and a value v_i = x_i W_v; score every query against every key with a dot product; scale
by 1/sqrt(d_k) so the softmax does not saturate; mask what may not be seen (future tokens get -inf, so
their weight after the softmax is exactly 0); softmax each row into attention weights; and return the
weighted sum of the values:

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V

Multi-head attention runs h such heads side by side on d_k = d_model / h dimensions each, concatenates
their outputs and mixes them with the output projection W_o. Grouped-query attention (Ainslie et al. 2023,
"GQA"; Llama 2/3, Qwen2) keeps h query heads but only h_kv key/value heads, each shared by a group of
h / h_kv consecutive query heads (query head j reads key/value head j // (h / h_kv)); h_kv = 1 is
multi-query attention (Shazeer 2019). W_k and W_v then output h_kv d_k values, and a KV cache holds h_kv
heads instead of h.

Two paths compute the same numbers. The fast path calls ``F.scaled_dot_product_attention`` (fused
kernels); the explicit path spells the steps out and can return the weights. The explicit path runs when
weights are asked for (``need_weights=True`` or inside :func:`qkv.layers.capture.capture`).

The explicit path repeats each key/value head for the query heads of its group (:func:`repeat_kv`), so
its keys, values and weights are per query head, (B, h, T, ...), whatever h_kv is; the fast path hands
the h_kv heads to the fused kernel as they are (:func:`grouped_sdpa`).

Masks are boolean with **True meaning "may attend"** (as in ``F.scaled_dot_product_attention``), except
``key_padding_mask`` which, as in ``nn.MultiheadAttention``, is True where a key is padding. A query row
with no key left to attend to yields zeros, never NaN. :func:`attention_mask` makes every mask the paths
use: causal (a query at position p sees keys j <= p), a causal sliding window (p - window < j <= p, as
Mistral and Qwen2 slide it), any given mask and the padding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.layers.capture import is_capturing, record
from qkv.layers.kv_cache import LayerKVCache
from qkv.layers.linear import Linear
from qkv.layers.positional import apply_rotary


def attention_scores(queries: Tensor, keys: Tensor) -> Tensor:
    """Dot product of every query with every key: omega_ij = q_i . k_j, as a matrix Q K^T. (..., Tq, Tk)"""
    return queries @ keys.transpose(-2, -1)


def attention_mask(
    n_queries: int,
    n_keys: int | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    query_positions: Tensor | None = None,
    attn_mask: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    device: torch.device | None = None,
) -> Tensor | None:
    """The one boolean "may attend" mask, True where query i may see key j, broadcastable to (B, H, Tq, Tk);
    None when nothing is masked.

    Key j sits at position j (0 .. Tk-1). Query i sits at ``query_positions[..., i]`` ((Tq,), or (B, Tq) for
    a position per row), by default at i + (Tk - Tq): the last Tq positions, as when decoding with a KV cache.

    - ``causal``: a query at position p sees the keys j <= p, never its future;
    - ``window``: a causal sliding window (Mistral, Qwen2): a query at p sees the keys p - window < j <= p,
      the last ``window`` positions including its own (so it implies ``causal``);
    - ``attn_mask``: any boolean mask of the same meaning, combined with the above;
    - ``key_padding_mask`` (B, Tk): True at padding keys, which no query sees.

    The result is (Tq, Tk), (B, 1, Tq, Tk) with a position per row or with padding, or ``attn_mask``'s shape.
    """
    n_keys = n_queries if n_keys is None else n_keys
    mask = None
    if causal or window is not None:
        if window is not None and (isinstance(window, bool) or window < 1):
            raise ValueError(f"window={window!r} must be a positive number of positions")
        if query_positions is None:
            queries = torch.arange(n_keys - n_queries, n_keys, device=device)  # (Tq,)
        else:
            queries = query_positions.to(device) if device is not None else query_positions
        keys = torch.arange(n_keys, device=queries.device)  # (Tk,)
        behind = queries[..., None] - keys  # (..., Tq, Tk): how far key j lies behind query i
        mask = behind >= 0
        if window is not None:
            mask = mask & (behind < window)
        if mask.dim() == 3:
            mask = mask[:, None]  # (B, 1, Tq, Tk): one set of positions per row, shared by the heads
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise TypeError("attn_mask must be boolean with True where attention is allowed")
        mask = attn_mask if mask is None else mask & attn_mask
    if key_padding_mask is not None:
        keep = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, Tk)
        mask = keep if mask is None else mask & keep
    return mask


def causal_mask(n_queries: int, n_keys: int | None = None, device: torch.device | None = None) -> Tensor:
    """Boolean (Tq, Tk) mask, True where query i may see key j, i.e. j is not in i's future.

    With ``n_keys > n_queries`` the queries are the *last* Tq positions (decoding with a KV cache):
    query i sits at absolute position i + (Tk - Tq). (:func:`attention_mask` with ``causal=True``.)
    """
    mask = attention_mask(n_queries, n_keys, causal=True, device=device)
    assert mask is not None
    return mask


def window_hides_keys(n_keys: int, window: int | None) -> bool:
    """Whether a causal ``window`` can hide any of ``n_keys`` keys (no: every key lies inside it, and the
    window is plain causal attention). Under torch.compile or torch.export the answer is always yes, so that
    a graph traced at short lengths still slides the window at long ones."""
    if window is None:
        return False
    tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
    return tracing or n_keys > window


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis after setting disallowed scores to -inf; fully masked rows become 0."""
    if mask is None:
        return torch.softmax(scores, dim=-1)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)


def repeat_kv(x: Tensor, group: int) -> Tensor:
    """(..., h_kv, T, d) -> (..., h_kv * group, T, d): each key/value head repeated for the ``group`` query
    heads that share it (head j of the result is head j // group of ``x``; Hugging Face's ``repeat_kv``)."""
    return x if group == 1 else x.repeat_interleave(group, dim=-3)


def _group(queries: Tensor, keys: Tensor) -> int:
    """Query heads per key/value head: h / h_kv for (..., h, T, d) and (..., h_kv, T, d); 1 without heads."""
    if queries.dim() < 4 or queries.shape[-3] == keys.shape[-3]:
        return 1
    return queries.shape[-3] // keys.shape[-3]


_SDPA_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def grouped_sdpa(queries: Tensor, keys: Tensor, values: Tensor, **kwargs: object) -> Tensor:
    """``F.scaled_dot_product_attention`` of h query heads (..., h, Tq, d_k) over h_kv key/value heads
    (..., h_kv, Tk, d_k), h_kv dividing h: torch's ``enable_gqa`` (no copy of the keys and values) where
    torch has it (2.5+), else the keys and values repeated per query head."""
    group = _group(queries, keys)
    if group == 1:
        return F.scaled_dot_product_attention(queries, keys, values, **kwargs)  # type: ignore[arg-type]
    if _SDPA_HAS_GQA:
        return F.scaled_dot_product_attention(queries, keys, values, enable_gqa=True, **kwargs)  # type: ignore[arg-type]
    return F.scaled_dot_product_attention(queries, repeat_kv(keys, group), repeat_kv(values, group), **kwargs)  # type: ignore[arg-type]


def scaled_dot_product_attention(
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """softmax(Q K^T / sqrt(d_k) + mask) V, returning (context vectors, weights or None).

    Shapes: queries (..., Tq, d_k), keys (..., Tk, d_k), values (..., Tk, d_v). ``mask`` is boolean, True
    where attention is allowed; ``causal`` adds the look-ahead mask, ``window`` a causal sliding window (the
    queries are the last Tq of the Tk positions: :func:`attention_mask`). ``need_weights`` selects the
    explicit path and returns the (pre-dropout) attention weights (..., Tq, Tk). With heads, keys and values
    may have fewer heads than the queries (grouped-query attention: (..., h_kv, Tk, d_k), h_kv dividing h).
    """
    n_queries, n_keys = queries.shape[-2], keys.shape[-2]
    if not window_hides_keys(n_keys, window):
        window = None  # every key lies inside the window: plain causal attention
    if not need_weights:
        from qkv.native import prompt_attention  # here: imported above, it reorders mypy's view of qkv/__init__.py

        if causal and mask is None and prompt_attention.applies(queries, keys, values, dropout_p=dropout_p):
            out = prompt_attention.causal_attention(queries, keys, values, window=window, scale=scale)
            if out is not None:  # a prompt on the CPU, without gradients: the C library's kernel
                return out, None
        if causal and window is None and mask is None and n_queries == n_keys:
            return grouped_sdpa(queries, keys, values, dropout_p=dropout_p, is_causal=True, scale=scale), None
        if causal or window is not None:
            mask = attention_mask(n_queries, n_keys, causal=True, window=window, attn_mask=mask, device=queries.device)
        out = grouped_sdpa(queries, keys, values, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        if mask is not None:  # some kernels give NaN for rows with nothing to attend to
            out = out.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
        return out, None

    group = _group(queries, keys)
    keys, values = repeat_kv(keys, group), repeat_kv(values, group)
    weights = attention_weights(queries, keys, mask, causal=causal, window=window, scale=scale)
    dropped = F.dropout(weights, dropout_p) if dropout_p > 0 else weights
    return dropped @ values, weights


def attention_weights(
    queries: Tensor,
    keys: Tensor,
    mask: Tensor | None = None,
    *,
    causal: bool = False,
    window: int | None = None,
    scale: float | None = None,
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k) + mask): the attention weights (..., Tq, Tk), each row summing to 1 (or 0
    for a row with nothing to attend to). ``mask`` is boolean, True where attention is allowed; ``causal``
    and ``window`` add the look-ahead mask and a causal sliding window (:func:`attention_mask`)."""
    scale = 1.0 / math.sqrt(queries.shape[-1]) if scale is None else scale
    scores = attention_scores(queries, keys) * scale  # (..., Tq, Tk)
    if causal or window is not None:
        n_queries, n_keys = queries.shape[-2], keys.shape[-2]
        mask = attention_mask(n_queries, n_keys, causal=True, window=window, attn_mask=mask, device=queries.device)
    return masked_softmax(scores, mask)


def _plain(*layers: nn.Module) -> bool:
    """Whether every layer is a plain linear one (its ``weight`` is all it multiplies by, and it trains)."""
    return all(type(layer) in (nn.Linear, Linear) for layer in layers)


def _stacked_linear(x: Tensor, layers: tuple[nn.Linear, ...]) -> Tensor:
    """[x W_1^T + b_1, x W_2^T + b_2, ...] as one matmul: (..., d_in) -> (..., sum of d_out)."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])
    return F.linear(x, weight, bias)


class MultiHeadAttention(nn.Module):
    """h heads of scaled dot-product attention with projections W_q, W_k, W_v and output projection W_o;
    ``n_kv_heads`` key/value heads (default h; fewer: grouped-query attention, see the module docstring).

    One module serves every use in the sources (docs/references.md): self-attention (``context=None``), causal
    self-attention
    (``causal=True``, the decoder's masked attention) and cross-attention (queries from ``x``, keys and
    values from ``context``, e.g. the encoder output). ``cache`` holds keys and values of earlier
    positions for incremental decoding; ``rotary`` = (cos, sin) applies RoPE to queries and keys.
    ``qkv_bias`` (default ``bias``) puts biases on W_q, W_k, W_v; ``bias`` on W_o (Qwen2: only the former).
    ``window`` slides a causal window over causal self-attention: each position sees the last ``window``
    positions, its own included (Mistral v0.1, Qwen2 with use_sliding_window; :func:`attention_mask`).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        n_kv_heads: int | None = None,
        dropout: float = 0.0,
        bias: bool = True,
        qkv_bias: bool | None = None,
        context_dim: int | None = None,
        window: int | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(
                f"d_model={d_model} must be divisible by n_heads={n_heads}, and n_heads by n_kv_heads={n_kv_heads}"
            )
        if window is not None and (isinstance(window, bool) or window < 1):
            raise ValueError(f"window={window!r} must be a positive number of positions")
        self.window = window  # applied when the attention is causal
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.n_kv_heads, self.kv_dim = n_kv_heads, n_kv_heads * self.head_dim
        self.group = n_heads // n_kv_heads  # query heads per key/value head
        self.dropout = dropout
        context_dim = d_model if context_dim is None else context_dim
        qkv_bias = bias if qkv_bias is None else qkv_bias
        self.query = Linear(d_model, d_model, bias=qkv_bias)  # W_q
        self.key = Linear(context_dim, self.kv_dim, bias=qkv_bias)  # W_k: (h_kv d_k, d_context)
        self.value = Linear(context_dim, self.kv_dim, bias=qkv_bias)  # W_v
        self.out_proj = Linear(d_model, d_model, bias=bias)  # W_o

    def project(self, x: Tensor, context: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Q = x W_q, K = c W_k, V = c W_v with c = ``context`` (cross-attention) or ``x`` (self-attention).

        While training, the projections that read the same input run as one matmul with the weights
        stacked (one large product is faster than three small ones, and copying the weights costs little
        next to a batch of tokens); at inference, and for other layers (LoRA, int8), each is called in place.
        """
        if not torch.is_grad_enabled() or not _plain(self.query, self.key, self.value):  # LoRA, int8: their own
            source = x if context is None else context
            return self.query(x), self.key(source), self.value(source)
        widths = [self.d_model, self.kv_dim, self.kv_dim]
        if context is None:
            fused = (self.query, self.key, self.value)
            return _stacked_linear(x, fused).split(widths, dim=-1)
        keys, values = _stacked_linear(context, (self.key, self.value)).split(widths[1:], dim=-1)
        return self.query(x), keys, values

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, n d_k) -> (B, n, T, d_k): each head sees its own slice of the projected vector (n = h for
        queries, h_kv for keys and values)."""
        batch, length, _ = x.shape
        return x.view(batch, length, -1, self.head_dim).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, h, T, d_k) -> (B, T, d_model): concatenate the heads' outputs."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        *,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        cache: LayerKVCache | None = None,
        rotary: tuple[Tensor, Tensor] | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``x`` (B, Tq, d_model) to itself or to ``context`` (B, Tk, d_context).

        Returns the output (B, Tq, d_model) and, if ``need_weights``, the weights (B, h, Tq, Tk).
        With a cache, cross-attention computes the context's keys and values once and reuses them; the
        cache holds the h_kv key/value heads.
        """
        if cache is not None and context is not None and cache.static:
            q, k, v = self.split_heads(self.query(x)), cache.keys, cache.values
        else:
            q, k, v = (self.split_heads(t) for t in self.project(x, context))  # (B, h or h_kv, T, d_k)
            if rotary is not None:
                q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
            if cache is not None:
                k, v = cache.store(k, v, static=context is not None)

        n_queries, n_keys = q.shape[-2], k.shape[-2]
        window = self.window if causal and window_hides_keys(n_keys, self.window) else None
        # A single new query (or a prefill from an empty cache) needs no explicit causal mask, unless a
        # window hides the oldest keys from it.
        causal = causal and (n_queries > 1 or window is not None)
        mask = attention_mask(
            n_queries, n_keys, attn_mask=attn_mask, key_padding_mask=key_padding_mask, device=x.device
        )
        dropout_p = self.dropout if self.training else 0.0
        weights = None
        if need_weights or is_capturing():  # the explicit path: every step is there to see (or to change)
            k, v = repeat_kv(k, self.group), repeat_kv(v, self.group)  # (B, h, Tk, d_k): one per query head
            q, k, v = record(self, "q", q), record(self, "k", k), record(self, "v", v)
            weights = attention_weights(q, k, mask, causal=causal, window=window)  # (B, h, Tq, Tk)
            weights = record(self, "weights", weights)
            out = (F.dropout(weights, dropout_p) if dropout_p > 0 else weights) @ v
        else:
            out, _ = scaled_dot_product_attention(q, k, v, mask, causal=causal, window=window, dropout_p=dropout_p)
        out = record(self, "context", out)  # (B, h, Tq, d_k): each head's output, before W_o mixes them
        out = self.out_proj(self.merge_heads(out))
        return out, (weights if need_weights else None)
