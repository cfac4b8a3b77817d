"""OpenAI's completions on a language model: ``n`` choices per prompt, ``stop``, ``echo``, ``logprobs``, ``usage``.

A :class:`CompletionJob` is one request. Iterating :meth:`CompletionJob.pieces` runs its choices one after
the other (prompt 0's n choices, then prompt 1's, ...; choice i = prompt_index * n + j) and yields
:class:`Piece` s of text as the tokens are made; the stream sends each piece as it comes, a plain request
joins them. Generation is :func:`qkv.decoding.stream` (its KV cache and fast path) or, with the batched
scheduler, one row of the server's batch (:mod:`qkv.server.scheduler`); each choice has its own
``torch.Generator``, made from the request's seed, so a seed gives the same choices every time, whatever
else the server is doing.

Log-probabilities are log softmax(logits) of the model's raw logits, as OpenAI reports them: they do not
depend on ``temperature``, ``top_k`` or ``top_p``, which only change which token is drawn. A generated
token's logprob comes from the logits of the step that chose it; the prompt's (with ``echo``) from
:func:`qkv.training.perplexity.token_log_probs`, the function ``qkv eval`` sums, so the two agree. The first
prompt token has no logprob (null): nothing comes before it. ``text_offset`` counts characters from the
start of the prompt, with or without ``echo``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from qkv.decoding import TextStreamer, stream
from qkv.decoding.stop import StopText
from qkv.inspect.tokens import token_text
from qkv.layers.softmax import log_softmax
from qkv.server.errors import ServiceError
from qkv.server.schemas import CompletionRequest
from qkv.training.perplexity import token_log_probs

if TYPE_CHECKING:
    from qkv.server.service import Service


@dataclass
class Prompt:
    """One prompt: its text (as given, or decoded from the ids it was given as) and its token ids."""

    text: str
    ids: list[int]
    _entries: list[Entry] | None = field(default=None, init=False, repr=False)  # echo logprobs, once

    def entries(self, service: Service, top: int) -> list[Entry]:
        if self._entries is None:
            self._entries = prompt_entries(service, self.ids, top)
        return self._entries


@dataclass
class Entry:
    """One token of a choice's logprobs: its text, log-probability, top alternatives and character offset."""

    token: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int


@dataclass
class Piece:
    """Text of choice ``index`` made since the last piece, its tokens' logprobs, and at the end its finish."""

    index: int
    text: str
    entries: list[Entry] = field(default_factory=list)
    finish_reason: str | None = None


def top_dict(service: Service, values: torch.Tensor, ids: torch.Tensor, chosen: int, chosen_lp: float) -> dict:
    """{token text: logprob} of the top alternatives, plus the chosen token when it is not among them."""
    top: dict[str, float] = {}
    for i, lp in zip(ids.tolist(), values.tolist(), strict=True):
        top.setdefault(token_text(service.tokenizer, i), lp)
    top.setdefault(token_text(service.tokenizer, chosen), chosen_lp)
    return top


def text_offsets(service: Service, ids: list[int]) -> list[int]:
    """The character offset at which each token's text begins when ``ids`` are decoded one after another."""
    streamer = TextStreamer(service.tokenizer, skip_special=False)
    offsets, at = [], 0
    for i in ids:
        offsets.append(at)
        at += len(streamer.push(i))
    return offsets


def prompt_entries(service: Service, ids: list[int], top: int) -> list[Entry]:
    """The prompt's tokens with their logprobs (the first one null), as ``echo`` returns them."""
    scored = token_log_probs(service.model, ids, top=top)
    offsets = text_offsets(service, ids)
    entries = [Entry(token_text(service.tokenizer, ids[0]), None, None, 0)]
    for t in range(1, len(ids)):
        lp = float(scored.logprobs[t - 1])
        values = scored.top_logprobs[t - 1] if top else torch.zeros(0)
        top_ids = scored.top_ids[t - 1] if top else torch.zeros(0, dtype=torch.long)
        entries.append(
            Entry(token_text(service.tokenizer, ids[t]), lp, top_dict(service, values, top_ids, ids[t], lp), offsets[t])
        )
    return entries


def _unsupported(name: str, why: str) -> ServiceError:
    return ServiceError(400, f"{name} is not supported: {why}", param=name, code="unsupported_parameter")


def check_request(service: Service, request: CompletionRequest) -> None:
    """400 or 404 for what no generation should start with: the checks that need no tokenizing."""
    service.check_model(request.model)
    if request.suffix:
        raise _unsupported("suffix", "qkv's language models continue text left to right and cannot fill in "
                           "the middle; leave suffix out")  # fmt: skip
    if request.best_of is not None and request.best_of != request.n:
        raise _unsupported("best_of", "the server does not rank candidates; ask for n completions instead")
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(request, name):
            raise _unsupported(name, f"sampling uses temperature, top_k and top_p only; leave {name} out")
    if request.logit_bias:
        raise _unsupported("logit_bias", "sampling uses temperature, top_k and top_p only; leave it out")
    limits = service.limits
    for name, value, limit, flag in (
        ("max_tokens", request.max_tokens, limits.max_tokens, "--max-tokens"),
        ("n", request.n, limits.max_n, "--max-n"),
        ("logprobs", request.logprobs or 0, limits.max_logprobs, "--max-logprobs"),
    ):
        if value > limit:
            raise ServiceError(
                400,
                f"{name}={value} is more than this server allows ({limit}, {flag}): ask for at most {limit}",
                param=name,
                code="limit_exceeded",
            )


def read_prompts(service: Service, request: CompletionRequest) -> list[Prompt]:
    """The request's prompts as text and token ids (a text, texts, token ids, or lists of token ids)."""
    given = request.prompt
    if isinstance(given, str) or (given and all(isinstance(x, int) for x in given)):
        given = [given]
    prompts = []
    for i, item in enumerate(given):
        what = "prompt" if len(given) == 1 else f"prompt {i}"
        if isinstance(item, str):
            ids, text = service.encode(item, what), item
        else:
            ids = list(item)
            service.check_length(len(ids), what)
            bad = [t for t in ids if not 0 <= t < service.tokenizer.vocab_size]
            if bad:
                raise ServiceError(
                    400,
                    f"the {what} holds token id {bad[0]}, outside this model's vocabulary "
                    f"(0..{service.tokenizer.vocab_size - 1}): use ids from POST /tokenize",
                    param="prompt",
                    code="invalid_token_id",
                )
            text = service.tokenizer.decode(ids, skip_special=False)
        if not ids:
            raise ServiceError(400, f"the {what} gives no tokens: give some text", param="prompt")
        prompts.append(Prompt(text, ids))
    return prompts


class Choice:
    """One completion of one prompt (see the module docstring), made token by token: :meth:`opening` (the
    echoed prompt), :meth:`accept` for each new token, :meth:`closing` at the end. :meth:`pieces` drives it
    with :func:`qkv.decoding.stream` (the one-at-a-time scheduler); the batched scheduler
    (:mod:`qkv.server.scheduler`) calls the same three from its decoding loop."""

    def __init__(self, job: CompletionJob, prompt: Prompt, index: int, generator: torch.Generator) -> None:
        self.job, self.prompt, self.index, self.generator = job, prompt, index, generator
        request, service = job.request, job.service
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.eos = None if request.ignore_eos else service.tokenizer.eos_id
        self.wants_logprobs = request.logprobs is not None
        self._logits: torch.Tensor | None = None
        self._streamer = TextStreamer(service.tokenizer, prompt_ids=prompt.ids)
        self._stop = StopText([request.stop] if isinstance(request.stop, str) else request.stop or [])
        self._base, self._made, self._pending = len(prompt.text), 0, []

    def opening(self) -> list[Piece]:
        request = self.job.request
        if not request.echo:
            return []
        entries = self.prompt.entries(self.job.service, request.logprobs) if request.logprobs is not None else []
        return [Piece(self.index, self.prompt.text, entries)]

    def accept(self, token: int, logits: torch.Tensor | None) -> list[Piece]:
        """The text a new token releases (held back while it may begin a stop string); sets
        :attr:`finish_reason` once the choice is done (its end token, or a stop string)."""
        self.completion_tokens += 1
        self.job.token_made()
        if token == self.eos:
            self.finish_reason = "stop"
            return []
        if self.wants_logprobs:
            self._pending.append(self._entry(token, logits, self._base + self._made))
        piece = self._streamer.push(token)
        self._made += len(piece)
        text = self._stop.push(piece)
        entries = _released(self._pending, self._base + self._stop.released)
        if self._stop.stopped:
            self.finish_reason = "stop"
        return [Piece(self.index, text, entries)] if text or entries else []

    def closing(self) -> list[Piece]:
        """What the streamer and the stop check still hold, then the piece carrying the finish reason."""
        out = []
        stop = self._stop
        if not stop.stopped:  # the end: a character still held by the streamer, text held by the stop check
            text = stop.push(self._streamer.flush())
            text += stop.flush()
            entries = _released(self._pending, self._base + stop.released) if stop.stopped else self._pending
            if text or entries:
                out.append(Piece(self.index, text, entries))
        if self.finish_reason is None:
            self.finish_reason = "stop" if stop.stopped else "length"
        return [*out, Piece(self.index, "", [], self.finish_reason)]

    def pieces(self) -> Iterator[Piece]:
        yield from self.opening()
        job, request = self.job, self.job.request
        tokens = stream(
            job.service.model,
            self.prompt.ids,
            max_new_tokens=request.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k or None,
            top_p=request.top_p,
            eos_id=self.eos,
            engine=job.service.engine,
            generator=self.generator,
            on_logits=self._keep if self.wants_logprobs else None,
        )
        try:
            for token in tokens:
                if job.cancelled.is_set():
                    return
                yield from self.accept(token, self._logits)
                if self.finish_reason is not None:
                    break
        finally:
            tokens.close()
        yield from self.closing()

    def _keep(self, logits: torch.Tensor) -> None:
        self._logits = logits[0]  # (V,)

    def _entry(self, token: int, logits: torch.Tensor, offset: int) -> Entry:
        lp = log_softmax(logits.float())  # (V,): the raw logits of the step that chose ``token``
        chosen = float(lp[token])
        k = self.job.request.logprobs
        values, ids = lp.topk(k) if k else (torch.zeros(0), torch.zeros(0, dtype=torch.long))
        text = token_text(self.job.service.tokenizer, token)
        return Entry(text, chosen, top_dict(self.job.service, values, ids, token, chosen), offset)


def _released(pending: list[Entry], end: int) -> list[Entry]:
    """Take from ``pending`` the entries whose text starts before ``end`` (the text released so far)."""
    n = 0
    while n < len(pending) and pending[n].offset < end:
        n += 1
    out = pending[:n]
    del pending[:n]
    return out


def choice_generator(seed: int | None, index: int, device: torch.device) -> torch.Generator:
    """Choice ``index``'s own random generator: ``seed`` for choice 0, a number made from (seed, index) for
    the others, fresh when there is no seed. One per choice, so a choice draws the same tokens whether the
    choices run one after another or side by side in a batch, whatever runs beside them."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh, nondeterministic
    else:
        generator.manual_seed(seed if index == 0 else hash((seed, index)) & (2**63 - 1))
    return generator


class CompletionJob:
    """One /v1/completions request: its prompts, its choices (each with its own random generator) and the
    times the metrics report (arrival, start, first token, end)."""

    def __init__(self, service: Service, request: CompletionRequest, prompts: list[Prompt]) -> None:
        self.service, self.request, self.prompts = service, request, prompts
        self.id = "-"  # the response's id, once the app has made it (the log line names the request by it)
        self.cancelled = threading.Event()
        n = request.n
        self.choices = [
            Choice(self, p, i * n + j, choice_generator(request.seed, i * n + j, service.device))
            for i, p in enumerate(prompts)
            for j in range(n)
        ]
        self.arrived = time.perf_counter()
        self.started: float | None = None  # when it got a slot (the gate, or a row of the batch)
        self.first_token: float | None = None
        self.last_token: float | None = None

    def token_made(self) -> None:
        self.service.metrics.token()
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now

    def pieces(self) -> Iterator[Piece]:
        """Every choice's pieces, choice after choice (nothing more once :meth:`cancel` was called)."""
        for choice in self.choices:
            if self.cancelled.is_set():
                return
            yield from choice.pieces()

    def cancel(self) -> None:
        """Stop at the next token (the client went away); safe to call from any thread."""
        self.cancelled.set()

    def usage(self) -> dict:
        prompt = sum(len(p.ids) for p in self.prompts)
        completion = sum(c.completion_tokens for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def run(self) -> list[dict]:
        """Run every choice to its end; the choices in OpenAI's shape."""
        return self.assemble(self.pieces())

    def assemble(self, pieces: Iterable[Piece]) -> list[dict]:
        """The choices in OpenAI's shape from their pieces, in whatever order the pieces came."""
        texts: dict[int, list[str]] = {c.index: [] for c in self.choices}
        entries: dict[int, list[Entry]] = {c.index: [] for c in self.choices}
        for piece in pieces:
            texts[piece.index].append(piece.text)
            entries[piece.index] += piece.entries
        return [
            choice_dict(c.index, "".join(texts[c.index]), entries[c.index], self.request, c.finish_reason)
            for c in self.choices
        ]


def logprobs_dict(entries: list[Entry]) -> dict:
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [e.top for e in entries],
        "text_offset": [e.offset for e in entries],
    }


def choice_dict(index: int, text: str, entries: list[Entry], request: CompletionRequest, finish: str | None) -> dict:
    logprobs = logprobs_dict(entries) if request.logprobs is not None else None
    return {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}
