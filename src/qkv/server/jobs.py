"""A completion request, checked once and made into a job: its prompts as ids, one SamplingParams, its choices.

:func:`prepare_completion` is the one place a ``/v1/completions`` body is checked against the server's limits and
turned into what the decoding engine runs: each prompt tokenized (or its ids checked), the sampling settings as
one :class:`~qkv.decoding.sampling_params.SamplingParams`, and ``n`` choices per prompt, choice i = prompt_index
* n + j as OpenAI numbers them, each an engine :class:`~qkv.decoding.engine.Request` with its own
``torch.Generator`` made from the request's seed, so a seed gives the same choices every time, whatever else the
server is doing. Chat requests (:mod:`qkv.server.chat_jobs`) build the same job from a rendered conversation.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, cast

import torch

from qkv.chat_templates import ChatTemplate, chat_prompt
from qkv.decoding.request import Request
from qkv.decoding.sampling_params import SamplingParams
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.server.errors import ServiceError
from qkv.server.limits import Limits
from qkv.server.notes import add_note
from qkv.server.schemas import ChatCompletionRequest, CompletionRequest
from qkv.tokenizers.base import Tokenizer
from qkv.tokenizers.unknown import unknown_note


@dataclass
class Prompt:
    """One prompt: its text (as given, or decoded from the ids it was given as) and its token ids."""

    text: str
    ids: list[int]


@dataclass(eq=False)
class Choice:
    """One completion of one prompt: its index in the response and the engine request that makes it."""

    index: int
    prompt: Prompt
    request: Request


@dataclass(eq=False)
class CompletionJob:
    """One request: its prompts, settings and choices, and the times the metrics report (arrival, start, first
    and last token)."""

    prompts: list[Prompt]
    params: SamplingParams
    choices: list[Choice]
    echo: bool = False
    id: str = "-"  # the response's id, once the route has made it (the log line names the request by it)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)
    started: float | None = None  # when it got a slot (the gate, or a row of the batch)
    first_token: float | None = None
    last_token: float | None = None
    completion_tokens: int = 0

    def token_made(self) -> None:
        self.completion_tokens += 1
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        self.last_token = now

    def cancel(self) -> None:
        """Stop at the next step (the client went away); safe to call from any thread."""
        self.cancelled.set()

    def usage(self) -> dict:
        prompt = sum(len(p.ids) for p in self.prompts)
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens}  # fmt: skip


def choice_generator(seed: int | None, index: int, device: torch.device) -> torch.Generator:
    """Choice ``index``'s own random generator: ``seed`` for choice 0, a number made from (seed, index) for the
    others, fresh when there is no seed. One per choice, so a choice draws the same tokens whether the choices run
    one after another or side by side in a batch, whatever runs beside them."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()  # fresh, nondeterministic
    else:
        generator.manual_seed(seed if index == 0 else hash((seed, index)) & (2**63 - 1))
    return generator


def _unsupported(name: str, why: str) -> ServiceError:
    return ServiceError(400, f"{name} is not supported: {why}", param=name, code="unsupported_parameter")


def check_pairs(request) -> None:
    """400 for settings that only mean something beside another that is missing or says otherwise: stream_options
    without stream (OpenAI refuses it too), a chat's max_tokens and max_completion_tokens that differ."""
    if request.stream_options is not None and not request.stream:
        raise ServiceError(400, "stream_options is only for streamed answers: set stream to true, or leave "
                           "stream_options out", param="stream_options", code="invalid_value")  # fmt: skip
    both = [getattr(request, name, None) for name in ("max_tokens", "max_completion_tokens")]
    if None not in both and both[0] != both[1]:
        raise ServiceError(400, f"max_tokens={both[0]} and max_completion_tokens={both[1]} differ: give one of them "
                           "(max_completion_tokens is OpenAI's newer name)", param="max_tokens",
                           code="invalid_value")  # fmt: skip


def check_limits(limits: Limits, **values: int) -> None:
    """400 when a count is over the server's limit (max_tokens, n, logprobs)."""
    flags = {"max_tokens": (limits.max_tokens, "--max-tokens"), "n": (limits.max_n, "--max-n"),
             "logprobs": (limits.max_logprobs, "--max-logprobs")}  # fmt: skip
    for name, value in values.items():
        limit, flag = flags[name]
        if value > limit:
            raise ServiceError(400, f"{name}={value} is more than this server allows ({limit}, {flag}): ask for at "
                               f"most {limit}", param=name, code="limit_exceeded")  # fmt: skip


def sampling_params(request, *, max_tokens: int, logprobs: int | None, prompt_lookup: int = 0) -> SamplingParams:
    """The request's sampling fields as one SamplingParams; a value it refuses is a 400 naming the field. A greedy
    request without penalties drafts up to ``prompt_lookup`` tokens a step from its text (``qkv serve
    --prompt-lookup``, :mod:`qkv.decoding.prompt_lookup`): the same tokens, in fewer steps where the answer repeats
    the prompt."""
    try:
        params = SamplingParams(
            max_new_tokens=max_tokens,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            stop=_stops(request.stop),
            ignore_eos=request.ignore_eos,
            logprobs=logprobs,
            seed=request.seed,
        )
    except QkvError as error:
        raise ServiceError(400, str(error), code="invalid_value") from None
    if prompt_lookup and not params.not_greedy():
        return replace(params, prompt_lookup=prompt_lookup)
    return params


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    return (stop,) if isinstance(stop, str) else tuple(stop or ())


def check_prompt_length(n: int, limits: Limits, what: str) -> None:
    """413 when a prompt has more tokens than --max-prompt-tokens."""
    if n > limits.max_prompt_tokens:
        raise ServiceError(
            413,
            f"the {what} has {n} tokens, more than the {limits.max_prompt_tokens} accepted (--max-prompt-tokens): "
            "shorten it",
            param="prompt",
            code="context_length_exceeded",
        )


def read_prompts(request: CompletionRequest, tokenizer: Tokenizer, limits: Limits) -> list[Prompt]:
    """The request's prompts as text and token ids (a text, texts, token ids, or lists of token ids)."""
    given = request.prompt
    if isinstance(given, str) or (given and all(isinstance(x, int) for x in given)):
        items = cast("list[str | list[int]]", [given])  # one prompt: a text, or its token ids
    else:
        items = cast("list[str | list[int]]", given)  # texts, or lists of token ids
    prompts = []
    for i, item in enumerate(items):
        what = "prompt" if len(items) == 1 else f"prompt {i}"
        if isinstance(item, str):
            ids, text = tokenizer.encode(item), item
            check_prompt_length(len(ids), limits, what)
            add_note(unknown_note(tokenizer, item, f"the {what}", ids))
        else:
            ids = list(item)
            check_prompt_length(len(ids), limits, what)
            bad = [t for t in ids if not 0 <= t < tokenizer.vocab_size]
            if bad:
                raise ServiceError(
                    400,
                    f"the {what} holds token id {bad[0]}, outside this model's vocabulary "
                    f"(0..{tokenizer.vocab_size - 1}): use ids from POST /tokenize",
                    param="prompt",
                    code="invalid_token_id",
                )
            text = tokenizer.decode(ids, skip_special=False)
        if not ids:
            raise ServiceError(400, f"the {what} gives no tokens: give some text", param="prompt")
        prompts.append(Prompt(text, ids))
    return prompts


def check_completion(request: CompletionRequest, limits: Limits) -> None:
    """400 for what no generation should start with: the checks that need no tokenizing."""
    if request.suffix:
        raise _unsupported("suffix", "qkv's language models continue text left to right and cannot fill in "
                           "the middle; leave suffix out")  # fmt: skip
    if request.best_of is not None and request.best_of != request.n:
        raise _unsupported("best_of", "the server does not rank candidates; ask for n completions instead")
    if request.logit_bias:
        raise _unsupported("logit_bias", "leave it out; the penalties and min_p shape the distribution instead")
    check_pairs(request)
    check_limits(limits, max_tokens=request.max_tokens, n=request.n, logprobs=request.logprobs or 0)


def make_job(prompts: list[Prompt], params: SamplingParams, n: int, stop_ids: frozenset[int], device) -> CompletionJob:
    """The job of ``n`` choices per prompt, each with its engine request and generator."""
    stops = frozenset() if params.ignore_eos else stop_ids
    choices = []
    for i, prompt in enumerate(prompts):
        for j in range(n):
            index = i * n + j
            generator = choice_generator(params.seed, index, device)
            request = Request(prompt.ids, params, stops, generator)
            choices.append(Choice(index, prompt, request))
    return CompletionJob(prompts, params, choices)


def prepare_completion(request: CompletionRequest, tokenizer: Tokenizer, limits: Limits, device) -> CompletionJob:
    """Check a completion request once and prepare its job (nothing runs until a scheduler takes it)."""
    check_completion(request, limits)
    params = sampling_params(
        request, max_tokens=request.max_tokens, logprobs=request.logprobs, prompt_lookup=limits.prompt_lookup
    )
    prompts = read_prompts(request, tokenizer, limits)
    eos = tokenizer.eos_id
    job = make_job(prompts, params, request.n, frozenset() if eos is None else frozenset({eos}), device)
    job.echo = request.echo
    return job


def check_chat(request: ChatCompletionRequest, limits: Limits) -> int:
    """400 for what a chat request may not ask for; its max tokens (max_completion_tokens, else max_tokens, else
    the server's --max-tokens)."""
    if request.logit_bias:
        raise _unsupported("logit_bias", "leave it out; the penalties and min_p shape the distribution instead")
    if request.response_format and request.response_format.get("type", "text") != "text":
        raise _unsupported("response_format", "qkv answers in text; leave response_format out or use {'type': 'text'}")
    if request.tool_choice not in (None, "none", "auto"):
        raise _unsupported("tool_choice", "qkv shows tools to the template but does not parse or force tool calls")
    if request.top_logprobs is not None and not request.logprobs:
        raise ServiceError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    check_pairs(request)
    given = [n for n in (request.max_completion_tokens, request.max_tokens) if n is not None]
    max_tokens = given[0] if given else limits.max_tokens
    check_limits(limits, max_tokens=max_tokens, n=request.n, logprobs=request.top_logprobs or 0)
    return max_tokens


def prepare_chat(request: ChatCompletionRequest, bundle: ModelBundle, template: ChatTemplate | None,
                 limits: Limits, device) -> CompletionJob:  # fmt: skip
    """Check a chat request once and prepare its job: the conversation rendered with the model's template (or the
    server's --chat-template), the answer ending at the template's end of turn."""
    max_tokens = check_chat(request, limits)
    logprobs = (request.top_logprobs or 0) if request.logprobs else None
    params = sampling_params(request, max_tokens=max_tokens, logprobs=logprobs, prompt_lookup=limits.prompt_lookup)
    messages = [m.model_dump(exclude_none=True) for m in request.messages]
    variables: dict[str, Any] = {"tools": request.tools} if request.tools else {}
    try:
        prompt = chat_prompt(bundle, messages, template=template, **variables)
    except QkvError as error:
        raise ServiceError(400, str(error), param="messages", code="invalid_value") from None
    check_prompt_length(len(prompt.ids), limits, "conversation")
    return make_job([Prompt(prompt.text, prompt.ids)], params, request.n, frozenset(prompt.stop_ids), device)
