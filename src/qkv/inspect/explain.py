"""What one attention head does, step by step, with real numbers.

The attention-mathematics notes' recipe, one line per step, each kept as a matrix in an :class:`Explanation`:

    1. tokens                     "The", "quick", "brown", "fox", "jumps"
    2. embeddings (+ positions)   x_i = W_E[token_i] (+ PE_i)
    3. queries, keys, values      q_i = x_i W_q,  k_i = x_i W_k,  v_i = x_i W_v      (one head: d_k columns)
    4. scores                     omega_ij = q_i . k_j,  i.e. Q K^T
    5. scaling                    omega_ij / sqrt(d_k)
    6. causal mask                -inf where j > i (decoder self-attention), so e^{-inf} = 0
    7. softmax                    alpha_ij = e^{s_ij} / sum_j' e^{s_ij'}; each row sums to 1
    8. weighted sum of values     z_i = sum_j alpha_ij v_j,  i.e. A V
    9. heads concatenated, W_o    concat(z^1 ... z^h) W_o + b_o                     (multi-head layers)

The numbers come from four kinds of input: Q, K, V given outright (the Attention Is All You Need notes' simplified
example,
:func:`explain_given`); embeddings and weight matrices (Raschka's section 3.4, :func:`explain_projected`);
embeddings alone, each token its own query, key and value and no scaling (Raschka's section 3.3.1,
:func:`explain_without_weights`); or a real model's layer and head, read from its own forward pass
(:func:`qkv.inspect.explain_model.explain_model`). Steps 4-8 always run through qkv's one implementation
(:func:`~qkv.layers.attention.attention_scores`, :func:`~qkv.layers.attention.attention_mask`,
:func:`~qkv.layers.attention.masked_softmax`), in float64 so that the sources' digits come out exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import find_position
from qkv.layers.attention import attention_mask, attention_scores, masked_softmax

Matrix = np.ndarray


@dataclass(repr=False)
class MultiHead(ShortRepr):
    """Step 9: every head's output z^h (h, Tq, d_k), concatenated (Tq, h*d_k), projected by W_o."""

    head_outputs: Matrix  # (h, Tq, d_k)
    concat: Matrix  # (Tq, h * d_k)
    W_o: Matrix  # (h * d_k, d_model): multiplies from the right, concat @ W_o
    b_o: Matrix | None  # (d_model,)
    output: Matrix  # (Tq, d_model)


@dataclass(repr=False)
class Explanation(ShortRepr):
    """Every intermediate of one attention head, as float64 numpy arrays (rows = tokens)."""

    title: str
    variant: str  # "given", "projected", "no-weights" or "model"
    query_tokens: list[str]
    key_tokens: list[str]
    queries: Matrix  # (Tq, d_k)
    keys: Matrix  # (Tk, d_k)
    values: Matrix  # (Tk, d_v)
    scale: float  # 1 / sqrt(d_k), or 1 for attention without weights
    causal: bool
    scores: Matrix  # (Tq, Tk) Q K^T
    scaled: Matrix  # (Tq, Tk) Q K^T * scale
    masked: Matrix  # (Tq, Tk) scaled with -inf where the mask hides a key
    weights: Matrix  # (Tq, Tk) softmax rows, each sums to 1
    output: Matrix  # (Tq, d_v) weights @ V
    query: int | None = None  # the row to focus on
    embeddings: Matrix | None = None  # (T, d_model) W_E rows
    positions: Matrix | None = None  # (T, d_model) positional encodings added to them
    inputs: Matrix | None = None  # (T, d_in) X, what W_q, W_k, W_v multiply
    projections: dict[str, Matrix] = field(default_factory=dict)  # "W_q", "W_k", "W_v": (d_in, h * d_k)
    n_heads: int = 1
    head: int = 0
    layer: int | None = None
    part: str | None = None
    heads: MultiHead | None = None
    model_difference: float | None = None  # max |our weights - the model's own captured weights|
    notes: list[str] = field(default_factory=list)

    @property
    def d_k(self) -> int:
        return self.queries.shape[-1]

    def to_dict(self) -> dict[str, Any]:
        """Every number, JSON-ready: matrices as lists of rows; masked (-inf) entries as null."""

        def plain(value: Any) -> Any:
            if isinstance(value, np.ndarray):
                if value.dtype == bool:
                    return value.tolist()
                if value.ndim > 1:
                    return [plain(row) for row in value]
                return [None if np.isinf(v) else float(v) for v in value]
            return value

        data: dict[str, Any] = {
            "title": self.title,
            "variant": self.variant,
            "query_tokens": self.query_tokens,
            "key_tokens": self.key_tokens,
            "layer": self.layer,
            "head": self.head,
            "n_heads": self.n_heads,
            "part": self.part,
            "causal": self.causal,
            "d_k": self.d_k,
            "scale": self.scale,
            "query": self.query,
        }
        for name in ("embeddings", "positions", "inputs"):
            data[name] = plain(getattr(self, name))
        data["projections"] = {name: plain(m) for name, m in self.projections.items()}
        for name in ("queries", "keys", "values", "scores", "scaled", "masked", "weights", "output"):
            data[name] = plain(getattr(self, name))
        if self.heads is not None:
            h = self.heads
            data["heads"] = {
                "head_outputs": plain(h.head_outputs),
                "concat": plain(h.concat),
                "W_o": plain(h.W_o),
                "b_o": plain(h.b_o),
                "output": plain(h.output),
            }
        data["model_difference"] = self.model_difference
        data["notes"] = self.notes
        return data

    def _repr_html_(self) -> str:
        """Every step as ``qkv explain`` prints it (:func:`~qkv.inspect.explain_view.render_explanation`), in a
        notebook."""
        from qkv.inspect.explain_view import render_explanation
        from qkv.inspect.notebook import rich_html

        return rich_html(lambda console: render_explanation(self, console, max_columns=8))


def _as_matrix(value: Any, name: str) -> Tensor:
    try:
        tensor = torch.as_tensor(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        raise QkvError(f"{name} must be a matrix of numbers (one row per token): check its values") from None
    if tensor.dim() != 2 or 0 in tensor.shape:
        raise QkvError(f"{name} must be a matrix (one row per token), got shape {tuple(tensor.shape)}: check it")
    if not torch.isfinite(tensor).all():
        raise QkvError(f"{name} holds inf or NaN: give finite numbers")
    return tensor


def attend(
    queries: Tensor, keys: Tensor, values: Tensor, *, causal: bool, scale: float, window: int | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Steps 4-8 for (..., Tq, d_k) queries: (scores, scaled, masked, weights, output), with qkv's functions.
    ``window``: the causal mask of a sliding window (each query sees the last ``window`` positions)."""
    scores = attention_scores(queries, keys)  # (..., Tq, Tk) omega = Q K^T
    scaled = scores * scale
    mask = attention_mask(scores.shape[-2], scores.shape[-1], causal=True, window=window) if causal else None
    masked = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    weights = masked_softmax(scaled, mask)  # (..., Tq, Tk), rows sum to 1
    return scores, scaled, masked, weights, weights @ values  # output (..., Tq, d_v)


def explain_attention(
    query_tokens: list[str],
    queries: Tensor,
    keys: Tensor,
    values: Tensor,
    *,
    key_tokens: list[str] | None = None,
    head: int = 0,
    causal: bool = False,
    scale: float | None = None,
    query: str | int | None = None,
    out_proj: tuple[Tensor, Tensor | None] | None = None,
    title: str = "",
    variant: str = "given",
    window: int | None = None,
) -> Explanation:
    """Steps 4-9 for heads given as (h, Tq, d_k) queries and (h, Tk, d_k) keys/values (or one head (T, d_k)).

    ``scale`` defaults to 1/sqrt(d_k); ``window`` narrows the causal mask to a sliding window (a model's own,
    Mistral's). ``out_proj`` = (W_o (h*d_k, d_model), b_o or None) adds step 9, the
    heads concatenated and projected. ``query`` picks the row to focus on (a token or an index).
    """
    key_tokens = query_tokens if key_tokens is None else key_tokens
    q, k, v = _heads(queries, keys, values, len(query_tokens), len(key_tokens))
    n_heads, n_queries, d_k = q.shape
    if causal and n_queries != k.shape[1]:
        raise QkvError("the causal mask needs as many queries as keys (self-attention): drop --causal")
    scale = 1.0 / math.sqrt(d_k) if scale is None else scale
    scores, scaled, masked, weights, output = attend(q, k, v, causal=causal, scale=scale, window=window)
    heads = None if out_proj is None else _multi_head(output, *out_proj)
    return Explanation(
        title=title,
        variant=variant,
        query_tokens=list(query_tokens),
        key_tokens=list(key_tokens),
        queries=q[head].numpy(),
        keys=k[head].numpy(),
        values=v[head].numpy(),
        scale=scale,
        causal=causal,
        scores=scores[head].numpy(),
        scaled=scaled[head].numpy(),
        masked=masked[head].numpy(),
        weights=weights[head].numpy(),
        output=output[head].numpy(),
        query=None if query is None else find_position(query_tokens, query),
        n_heads=n_heads,
        head=head,
        heads=heads,
    )


def _heads(queries: Tensor, keys: Tensor, values: Tensor, n_query_tokens: int, n_key_tokens: int
           ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Q, K, V in float64 as (h, T, d_k) (one head (T, d_k) gains the head axis), checked against each other
    and against the tokens: a QkvError saying which sizes disagree."""
    q, k, v = (t.double()[None] if t.dim() == 2 else t.double() for t in (queries, keys, values))
    n_heads, n_queries, d_k = q.shape
    if k.shape[:2] != v.shape[:2] or k.shape[-1] != d_k or k.shape[0] != n_heads:
        raise QkvError(
            f"queries {tuple(q.shape)}, keys {tuple(k.shape)} and values {tuple(v.shape)} do not fit together: "
            "Q and K need the same width d_k, K and V one row per key"
        )
    if n_queries != n_query_tokens or k.shape[1] != n_key_tokens:
        raise QkvError(
            f"there are {n_query_tokens} tokens but {n_queries} query rows and {k.shape[1]} key rows: "
            "give one row per token"
        )
    return q, k, v


def _multi_head(output: Tensor, w_o: Tensor, b_o: Tensor | None) -> MultiHead:
    """Step 9: every head's output (h, Tq, d_v) concatenated (Tq, h * d_v), then concat @ W_o (+ b_o)."""
    W_o, bias = w_o.double(), (b_o.double() if b_o is not None else None)
    concat = output.transpose(0, 1).reshape(output.shape[1], -1)  # (Tq, h * d_v): head 0's columns first
    if W_o.shape[0] != concat.shape[1]:
        raise QkvError(f"W_o has {W_o.shape[0]} rows but the heads concatenate to {concat.shape[1]}: fix W_o")
    projected = concat @ W_o + (bias if bias is not None else 0.0)  # (Tq, d_model)
    return MultiHead(
        output.numpy(), concat.numpy(), W_o.numpy(), None if bias is None else bias.numpy(), projected.numpy()
    )


def explain_given(
    tokens: list[str], Q: Any, K: Any, V: Any, *, causal: bool = False, query: str | int | None = None, **kw: Any
) -> Explanation:
    """The notes on Attention Is All You Need: Q, K and V given outright (one row per token), as "simplified
    transformations" of X."""
    q, k, v = _as_matrix(Q, "Q"), _as_matrix(K, "K"), _as_matrix(V, "V")
    explanation = explain_attention(tokens, q, k, v, causal=causal, query=query, variant="given", **kw)
    explanation.notes.append("Q, K and V are given, not computed: the example has no W_q, W_k, W_v.")
    return explanation


def _split(x: Tensor, n_heads: int, name: str) -> Tensor:
    """(T, h * d_k) -> (h, T, d_k): head h reads columns h*d_k ... (h+1)*d_k - 1."""
    length, width = x.shape
    if width % n_heads:
        raise QkvError(f"{name} has {width} columns, not divisible by {n_heads} heads: change --heads or the matrix")
    return x.view(length, n_heads, width // n_heads).transpose(0, 1)


def random_weights(
    d_in: int, d_out: int, seed: int, names: tuple[str, ...] = ("W_q", "W_k", "W_v")
) -> dict[str, Tensor]:
    """``torch.rand(d_in, d_out)`` for each name in turn from ``seed``: Raschka's initialisation, so
    seed 123 with Raschka's inputs and d_out = 2 reproduces its section 3.4 numbers (q_2 = [0.4306, 1.4551])."""
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.rand(d_in, d_out, generator=generator).double() for name in names}


def explain_projected(
    tokens: list[str],
    X: Any,
    *,
    W_q: Any = None,
    W_k: Any = None,
    W_v: Any = None,
    W_o: Any = None,
    n_heads: int = 1,
    head: int = 0,
    d_k: int = 2,
    seed: int = 123,
    causal: bool = False,
    query: str | int | None = None,
    title: str = "",
) -> Explanation:
    """Raschka, ch. 3, section 3.4: Q = X W_q, K = X W_k, V = X W_v (each W is (d_in, h * d_k)), then steps 4-9.

    Weight matrices not given are drawn with :func:`random_weights` (``torch.rand``, ``seed``), h * d_k
    columns wide. With ``n_heads > 1`` the columns are split into heads and W_o (square, random unless
    given) mixes the concatenated heads, as in the seed's section 3.6.
    """
    x = _as_matrix(X, "the embeddings X")
    given = {"W_q": W_q, "W_k": W_k, "W_v": W_v}
    width = next((np.asarray(w).shape[-1] for w in given.values() if w is not None), n_heads * d_k)
    drawn = random_weights(x.shape[1], width, seed, tuple(n for n, w in given.items() if w is None))
    weights = {n: drawn[n] if w is None else _as_matrix(w, n) for n, w in given.items()}
    for name, w in weights.items():
        if w.shape[0] != x.shape[1]:
            raise QkvError(f"{name} has {w.shape[0]} rows but the embeddings have {x.shape[1]} columns: fix {name}")
    if not 0 <= head < n_heads:
        raise QkvError(f"--head {head} is out of range: there are heads 0..{n_heads - 1}")
    q, k, v = (_split(x @ weights[n], n_heads, n) for n in ("W_q", "W_k", "W_v"))  # (h, T, d_k) each
    out_proj = None
    if n_heads > 1 or W_o is not None:
        width_v = weights["W_v"].shape[1]
        w_o = random_weights(width_v, width_v, seed + 1, ("W_o",))["W_o"] if W_o is None else _as_matrix(W_o, "W_o")
        out_proj = (w_o, None)
    explanation = explain_attention(
        tokens, q, k, v, head=head, causal=causal, query=query, out_proj=out_proj, title=title, variant="projected"
    )
    explanation.inputs = x.numpy()
    explanation.projections = {n: w.numpy() for n, w in weights.items()}
    random = [n for n, w in given.items() if w is None] + (["W_o"] if out_proj is not None and W_o is None else [])
    if random:
        explanation.notes.append(f"{', '.join(random)} are random (torch.rand, seed {seed}), as an untrained layer's.")
    return explanation


def explain_without_weights(
    tokens: list[str], X: Any, *, causal: bool = False, query: str | int | None = None, title: str = ""
) -> Explanation:
    """Raschka, ch. 3, section 3.3.1: no trainable weights; each token is its own query, key and value.

    omega = X X^T (no scaling), alpha = softmax rows, z = alpha X: the "context vectors".
    """
    x = _as_matrix(X, "the embeddings X")
    explanation = explain_attention(
        tokens, x, x, x, causal=causal, scale=1.0, query=query, title=title, variant="no-weights"
    )
    explanation.inputs = x.numpy()
    explanation.notes.append("No W_q, W_k, W_v: q_i = k_i = v_i = x_i, and no 1/sqrt(d) scaling (section 3.3.1).")
    return explanation
