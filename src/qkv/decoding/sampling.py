"""Choosing the next token from the model's logits: penalties, temperature, top-k, top-p and min-p.

The GPT notes: the unembedding W_U turns the final vector into one logit per vocabulary entry and the softmax
turns those into the next-token distribution. Dividing the logits by a temperature T before the softmax
reshapes it: T > 1 flattens it (more varied text), T < 1 sharpens it, and T -> 0 puts all the mass on the
largest logit, so T = 0 means greedy decoding (argmax, no randomness at all).

Three filters cut off the unlikely tail before sampling. Each is a small function from logits to logits that
sets the removed entries to -inf (so the softmax gives them exactly 0, as the causal mask does):

- :func:`top_k_filter` keeps the k largest logits of each row;
- :func:`top_p_filter` keeps the *nucleus*: the fewest most-likely tokens whose probabilities add up to p;
- :func:`min_p_filter` keeps the tokens whose probability is at least min_p times the largest one.

:func:`sampling_distribution` applies them in Hugging Face's order: logits / T, then top-k, top-p and min-p on
the tempered distribution, then softmax. Penalties (:func:`penalize`) come before all of it, on the raw logits,
because they depend on the text so far, not on the distribution. That distribution is the one
:func:`sample_next` draws from and the one the next-token views (``qkv next``, the playground) show: one
transform, written once. The settings come as one checked :class:`~qkv.decoding.sampling_params.SamplingParams`.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from torch import Tensor

from qkv.decoding.sampling_params import SamplingParams
from qkv.errors import QkvError
from qkv.layers.softmax import log_softmax, softmax
from qkv.native import logit_scan


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


def min_p_filter(logits: Tensor, p: float | None) -> Tensor:
    """Keep the tokens of each row (..., V) with probability >= ``p`` x the row's largest probability.

    In logits: log P(j) - log P(max) = logit_j - max logit >= log p. The likeliest token always stays; ``p``
    None or 0 returns ``logits`` unchanged."""
    if not p:
        return logits
    floor = logits.amax(dim=-1, keepdim=True) + torch.log(torch.tensor(p, dtype=logits.dtype))  # (..., 1)
    return logits.masked_fill(logits < floor, float("-inf"))


def penalize(logits: Tensor, params: SamplingParams, counts: Tensor, seen: Tensor) -> Tensor:
    """The logits (B, V) after the penalties of ``params``: ``counts`` (B, V) is how often each token was
    generated so far, ``seen`` (B, V) True where a token is anywhere in the text (prompt or new tokens).

    repetition: logit / r where it is > 0, logit * r where it is <= 0, on the ``seen`` tokens (CTRL);
    presence and frequency: logit - presence [count > 0] - frequency count (OpenAI's formula)."""
    out = logits
    if params.repetition_penalty != 1:
        r = params.repetition_penalty
        out = torch.where(seen, torch.where(out > 0, out / r, out * r), out)
    if params.presence_penalty or params.frequency_penalty:
        counts = counts.to(out.dtype)
        out = out - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(out.dtype)
    return out


def sampling_distribution(logits: Tensor, params: SamplingParams | None = None, **settings: Any) -> Tensor:
    """softmax(min_p(top_p(top_k(logits / T)))) over the last dimension: the distribution sampling draws from.

    ``logits`` is (..., V); so is the result, each row summing to 1 with exactly 0 on the filtered tokens.
    T = 0 is the greedy limit: all the mass on the largest logit (split evenly between exact ties). The
    settings are ``params`` or keyword arguments of :class:`SamplingParams` (checked once, here)."""
    params = SamplingParams.of(params, **settings)
    if params.greedy:
        return softmax(logits, 0)
    # Shift the largest logit to 0 first (softmax does not change): a tiny T then cannot overflow to inf.
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) / params.temperature  # (..., V)
    if params.filtered:
        scaled = min_p_filter(top_p_filter(top_k_filter(scaled, params.top_k), params.top_p), params.min_p)
    return softmax(scaled)


def scan_logits(logits: Tensor, argmax: bool = False) -> tuple[bool, Tensor | None]:
    """(whether no logit is NaN or infinite, each row's argmax (B,) if ``argmax``) for ``logits`` (B, V), in one
    read in C where it applies (:mod:`qkv.native.logit_scan`: a tenth of the time of PyTorch's passes on a 49k
    vocabulary). Else PyTorch: a float64 sum, which finite logits of any float dtype cannot overflow and NaN or inf
    anywhere poisons, and torch.argmax (the first of equal largest values)."""
    if logit_scan.applies(logits):
        return logit_scan.scan(logits, argmax)
    return math.isfinite(float(logits.sum(dtype=torch.float64))), logits.argmax(dim=-1) if argmax else None


def finite_picks(logits: Tensor, picks: list[int] | None = None, argmax: bool = False) -> list[int] | None:
    """Refuse logits (k, V) holding NaN (which poisons the softmax) or inf (no probability) with a QkvError, and
    give each row's argmax if ``argmax``: ``picks`` where the step read them already (-1 for a row with NaN or
    inf), else from one read here (:func:`scan_logits`)."""
    if picks is None:
        finite, found = scan_logits(logits, argmax)
        picks = None if found is None else found.tolist()
    else:
        finite = min(picks) >= 0
    if not finite:
        raise QkvError(
            "the model's logits are not finite (NaN or inf): its weights hold NaN or inf values, or overflow in "
            "this precision; check the model file, or run in float32"
        )
    return picks if argmax else None


def greedy(logits: Tensor) -> Tensor:
    """Each row's argmax (B,) of ``logits`` (B, V), the first of equal largest values: T = 0's token (torch.argmax's
    answer for a row with NaN too, where the scan says -1)."""
    finite, ids = scan_logits(logits, argmax=True)
    return cast(Tensor, ids) if finite else logits.argmax(dim=-1)


def sample_next(
    logits: Tensor,
    params: SamplingParams | None = None,
    *,
    generator: torch.Generator | None = None,
    **settings: Any,
) -> Tensor:
    """One next-token id per row of ``logits`` (B, V): a (B,) long tensor.

    T = 0 is greedy: the argmax of each row, no randomness (top_k/top_p/min_p cannot change the argmax).
    Otherwise the ids are drawn from :func:`sampling_distribution` with ``torch.multinomial`` and
    ``generator``, so a seeded generator gives reproducible samples. Penalties are not applied here (they need
    the text so far: :func:`penalize`)."""
    params = SamplingParams.of(params, **settings)
    if logits.dim() != 2:
        raise ValueError(f"sample_next takes logits of shape (B, V), got {tuple(logits.shape)}")
    if params.greedy:
        return greedy(logits)  # (B,)
    probs = sampling_distribution(logits, params)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def token_logprobs(logits: Tensor, tokens: list[int], top: int | None) -> tuple[list, list]:
    """(log p of each row's chosen token, each row's ``top`` most likely (id, log p) pairs) under the raw logits
    (k, V), as OpenAI's ``logprobs`` reports them; ``top`` None: neither (Nones and empty tuples), 0: no pairs."""
    if top is None:
        return [None] * len(tokens), [()] * len(tokens)
    lp = log_softmax(logits if logits.dtype in (torch.float32, torch.float64) else logits.float())  # (k, V)
    chosen = lp.gather(1, torch.tensor(tokens, device=lp.device)[:, None])[:, 0].tolist()
    if not top:
        return chosen, [()] * len(tokens)
    values, ids = lp.topk(min(top, lp.shape[-1]), dim=-1)
    return chosen, [tuple(zip(i, v, strict=True)) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]
