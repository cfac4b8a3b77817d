"""What goes into the decoding engine and what comes out of it, per text: a :class:`Request` (the prompt's ids,
its :class:`~qkv.decoding.sampling_params.SamplingParams` and the ids that end it) and, at every step, one
:class:`TokenOutput` (the token sampled from softmax(z / T) with the request's filters, its log-probability when
asked, and why the text finished). :mod:`qkv.decoding.engine` turns the one into the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qkv.decoding.sampling_params import SamplingParams


@dataclass(eq=False)
class Request:
    """One text to continue: its prompt ids, how to choose its tokens, and which ids end it (``stop_ids``: the
    end-of-sequence token, a chat template's end of turn; ignored with ``params.ignore_eos``). ``tag`` is the
    caller's own handle; :attr:`cropped` is set when it joins: prompt tokens dropped to fit the context."""

    prompt: list[int]
    params: SamplingParams
    stop_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None
    tag: object = None
    cropped: int = 0


@dataclass(frozen=True, eq=False)
class TokenOutput:
    """What one step made for one request: its new ``token``, and with ``params.logprobs`` the token's
    log-probability under the raw logits and the ``top`` alternatives ((id, logprob), ...); ``finish_reason``
    "stop" (a stop id) or "length" (max_new_tokens) when it ended; ``error`` when it failed (then no token)."""

    request: Request
    token: int | None = None
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()
    finish_reason: str | None = None
    error: BaseException | None = None
