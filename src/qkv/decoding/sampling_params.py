"""How a generation chooses its tokens and when it stops: one frozen object, checked once when it is made.

Every road to the model carries one :class:`SamplingParams`: :func:`qkv.decoding.generate` and
:func:`~qkv.decoding.stream`, each row of the decoding engine (:mod:`qkv.decoding.engine`), ``qkv chat`` and
the server's completions (the request builds it in one place). Its fields mean what they mean in OpenAI's API,
vLLM and llama.cpp:

- ``temperature`` T divides the logits before the softmax (the GPT notes): T > 1 flattens the distribution,
  T < 1 sharpens it, T = 0 is greedy (argmax). A T below 1e-5 counts as 0: dividing by it would overflow;
- ``top_k`` keeps the k likeliest tokens, ``top_p`` the nucleus of probability mass p, ``min_p`` the tokens at
  least ``min_p`` times as likely as the likeliest (Nguyen et al. 2024, "min-p sampling");
- ``repetition_penalty`` r (Keskar et al. 2019, CTRL) divides a positive logit by r and multiplies a negative
  one by r for every token already in the text (prompt and new tokens), as Hugging Face and vLLM do;
- ``presence_penalty`` and ``frequency_penalty`` (OpenAI) subtract ``presence`` once and ``frequency`` per
  occurrence from the logit of every token the generation has made so far (its new tokens, as vLLM counts);
- ``max_new_tokens`` bounds the new tokens; ``stop`` holds strings that end the text (the text layer checks them:
  :mod:`qkv.decoding.stop`); ``ignore_eos`` keeps going past the end token; ``logprobs`` asks for the chosen
  token's log-probability and that many top alternatives per step; ``seed`` makes the draws reproducible;
- ``prompt_lookup`` k > 0 drafts up to k tokens a step from the text itself, checked by the model in that step
  (:mod:`qkv.decoding.prompt_lookup`): the same greedy text, in fewer steps when the text repeats what it was
  given. Greedy decoding only, without penalties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from qkv.errors import QkvError

GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy: softmax(logits / T) is the argmax to float32 precision (vLLM's rule)."""

MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to choose each next token and when to stop; see the module docstring for each field."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    seed: int | None = None
    prompt_lookup: int = 0

    def __post_init__(self) -> None:
        self._check()
        normal = {  # one spelling per meaning: "keep every token" is None, a list of stops is a tuple
            "top_k": self.top_k or None,
            "top_p": None if self.top_p is None or self.top_p >= 1 else float(self.top_p),
            "min_p": self.min_p or None,
            "temperature": 0.0 if self.temperature < GREEDY_BELOW else float(self.temperature),
            "stop": (self.stop,) if isinstance(self.stop, str) else tuple(self.stop),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    def _check(self) -> None:
        self._check_counts()
        self._check_filters()
        self._check_penalties()
        self._check_prompt_lookup()

    def _check_counts(self) -> None:
        if not _is_whole(self.max_new_tokens) or self.max_new_tokens < 0:
            raise QkvError(f"max_new_tokens={self.max_new_tokens!r} must be a whole number >= 0: e.g. 100")
        if self.logprobs is not None and (not _is_whole(self.logprobs) or self.logprobs < 0):
            raise QkvError(f"logprobs={self.logprobs!r} must be a whole number >= 0 (top alternatives per token)")
        if self.seed is not None and (not _is_whole(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise QkvError(f"seed={self.seed!r} must be a whole number in [0, 2**64 - 1]")
        if not isinstance(self.ignore_eos, bool):
            raise QkvError(f"ignore_eos={self.ignore_eos!r} must be True or False")
        stops = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stops, tuple | list) or not all(isinstance(s, str) and s for s in stops):
            raise QkvError(f"stop={self.stop!r} must be a string or a list of non-empty strings")

    def _check_filters(self) -> None:
        if not _is_number(self.temperature) or self.temperature < 0:
            raise QkvError(
                f"temperature={self.temperature!r} must be a finite number >= 0: use 0 for greedy decoding, "
                "about 0.7-1.0 for varied text"
            )
        if self.top_k is not None and (not _is_whole(self.top_k) or self.top_k < 0):
            raise QkvError(
                f"top_k={self.top_k!r} must be a whole number >= 0: use e.g. 50, or 0/None to keep every token"
            )
        if self.top_p is not None and (not _is_number(self.top_p) or not 0 < self.top_p <= 1):
            raise QkvError(f"top_p={self.top_p!r} must be in (0, 1]: use e.g. 0.9, or 1/None to keep every token")
        if self.min_p is not None and (not _is_number(self.min_p) or not 0 <= self.min_p <= 1):
            raise QkvError(f"min_p={self.min_p!r} must be in [0, 1]: use e.g. 0.05, or 0/None to keep every token")

    def _check_prompt_lookup(self) -> None:
        if not _is_whole(self.prompt_lookup) or self.prompt_lookup < 0:
            raise QkvError(f"prompt_lookup={self.prompt_lookup!r} must be a whole number >= 0: drafted tokens a step")
        if self.prompt_lookup and self.not_greedy():
            raise QkvError(
                f"prompt_lookup={self.prompt_lookup} checks drafted tokens against greedy decoding: use temperature=0 "
                "without penalties, or prompt_lookup=0"
            )

    def _check_penalties(self) -> None:
        if not _is_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise QkvError(
                f"repetition_penalty={self.repetition_penalty!r} must be a number > 0: 1 is none, about 1.1-1.3 "
                "discourages repeats"
            )
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2 <= value <= 2:
                raise QkvError(f"{name}={value!r} must be a number in [-2, 2] (OpenAI's range): 0 is none")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax, no random numbers drawn."""
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (the engine then counts each row's tokens)."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0

    def not_greedy(self) -> list[tuple[str, float]]:
        """The settings, (name, value), that make a token other than the model's most likely one: a temperature
        of GREEDY_BELOW or more, each penalty. Empty: greedy decoding, which prompt lookup checks drafts against."""
        settings = (("temperature", self.temperature, self.temperature >= GREEDY_BELOW),
                    ("repetition_penalty", self.repetition_penalty, self.repetition_penalty != 1),
                    ("presence_penalty", self.presence_penalty, self.presence_penalty != 0),
                    ("frequency_penalty", self.frequency_penalty, self.frequency_penalty != 0))  # fmt: skip
        return [(name, value) for name, value, changes in settings if changes]

    @property
    def filtered(self) -> bool:
        """Whether top-k, top-p or min-p removes tokens before sampling."""
        return self.top_k is not None or self.top_p is not None or self.min_p is not None

    def replace(self, **changes: Any) -> SamplingParams:
        """A copy with some fields changed, checked again."""
        return replace(self, **changes)

    @classmethod
    def of(cls, params: SamplingParams | None = None, **settings: Any) -> SamplingParams:
        """``params`` with ``settings`` (field names) applied: the keyword form of :func:`qkv.decoding.generate`
        (``generate(model, ids, max_new_tokens=20, temperature=0)``) builds its object here, once."""
        unknown = sorted(set(settings) - FIELDS)
        if unknown:
            raise QkvError(
                f"unknown sampling setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                f"choose from {', '.join(sorted(FIELDS))}"
            )
        if params is not None and not isinstance(params, SamplingParams):
            raise QkvError(f"params must be a SamplingParams, got {type(params).__name__}: SamplingParams(...)")
        if params is None:
            return cls(**settings)
        return params.replace(**settings) if settings else params


FIELDS = frozenset(f.name for f in fields(SamplingParams))
