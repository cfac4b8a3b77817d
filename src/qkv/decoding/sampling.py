"""Choosing the next token from the model's logits: greedy, temperature, top-k and top-p (nucleus) sampling.

The GPT notes: the unembedding W_U turns the final vector into one logit per vocabulary entry and the softmax
turns those into the next-token distribution. Dividing the logits by a temperature T before the softmax
reshapes it: T > 1 flattens it (more varied text), T < 1 sharpens it, and T -> 0 puts all the mass on the
largest logit, so T = 0 means greedy decoding (argmax, no randomness at all).

Two filters cut off the unlikely tail before sampling. Each is a small function from logits to logits that
sets the removed entries to -inf (so the softmax gives them exactly 0, as the causal mask does):

- :func:`top_k_filter` keeps the k largest logits of each row;
- :func:`top_p_filter` keeps the *nucleus*: the fewest most-likely tokens whose probabilities add up to p.

:func:`sampling_distribution` applies them in the usual order (Hugging Face's): logits / T, then top-k, then
top-p on the tempered distribution, then softmax. That distribution is the one :func:`sample_next` draws from
and the one the next-token views (``qkv next``, the playground) show: one transform, written once.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.layers.softmax import softmax


def check_sampling(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None) -> None:
    """Raise QkvError (with the fix) unless T >= 0, top_k is None or >= 0, and top_p is None or in (0, 1]."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature >= 0:
        raise QkvError(
            f"temperature={temperature!r} must be a number >= 0: use 0 for greedy decoding, "
            "about 0.7-1.0 for varied text"
        )
    if math.isinf(temperature):
        raise QkvError(f"temperature={temperature!r} must be finite: use a value such as 1.0 (or 0 for greedy)")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
        raise QkvError(f"top_k={top_k!r} must be a whole number >= 0: use e.g. 50, or 0/None to keep every token")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise QkvError(f"top_p={top_p!r} must be in (0, 1]: use e.g. 0.9, or 1/None to keep every token")


def top_k_filter(logits: Tensor, k: int | None) -> Tensor:
    """Keep the ``k`` largest logits of each row (..., V) and set the others to -inf.

    ``k`` None or 0, or ``k >= V``, returns ``logits`` unchanged. Logits tied with the k-th largest are all
    kept, so a row can keep more than k entries when there are ties.
    """
    if not k or k >= logits.shape[-1]:
        return logits
    kth_largest = logits.topk(k, dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: Tensor, p: float | None) -> Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability mass reaches ``p``.

    Probabilities are softmax(logits) of each row (..., V). Tokens are taken in order of decreasing
    probability until their total is >= p; the rest are set to -inf. The most likely token is always kept
    (so a tiny p means greedy). ``p`` None or >= 1 returns ``logits`` unchanged.
    """
    if p is None or p >= 1:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (..., V), most likely first
    probs = softmax(sorted_logits)
    cumulative = probs.cumsum(dim=-1)
    mass_before = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1)
    remove_sorted = mass_before >= p  # the tokens before this one already reach p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)  # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def sampling_distribution(
    logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> Tensor:
    """softmax(top_p(top_k(logits / T))) over the last dimension: the distribution sampling draws from.

    ``logits`` is (..., V); so is the result, each row summing to 1 with exactly 0 on the filtered tokens.
    T = 0 is the greedy limit: all the mass on the largest logit (split evenly between exact ties).
    """
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return softmax(logits, 0)
    # Shift the largest logit to 0 first (softmax does not change): a tiny T then cannot overflow to inf.
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # (..., V)
    return softmax(top_p_filter(top_k_filter(scaled, top_k), top_p))


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One next-token id per row of ``logits`` (B, V): a (B,) long tensor.

    T = 0 is greedy: the argmax of each row, no randomness (top_k/top_p cannot change the argmax). Otherwise
    the ids are drawn from :func:`sampling_distribution` with ``torch.multinomial`` and ``generator``, so a
    seeded generator gives reproducible samples.
    """
    check_sampling(temperature, top_k, top_p)
    if logits.dim() != 2:
        raise ValueError(f"sample_next takes logits of shape (B, V), got {tuple(logits.shape)}")
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    probs = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
