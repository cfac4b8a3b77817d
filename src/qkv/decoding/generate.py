"""Generating text with a GPT: predict a token, append it, repeat (the GPT notes; the encoder-decoder notes' "one
token at a time").

:func:`generate` and :func:`stream` are the Python form of that loop for a batch of prompts that start together:
they hand the prompts to the decoding engine (:class:`qkv.decoding.engine.Engine`, the one loop every road to a
language model shares: its KV cache, context window and step strategies are described there) and collect the
tokens it returns. How each token is chosen is one :class:`~qkv.decoding.sampling_params.SamplingParams`, given
as ``params`` or as its fields in keyword form (``temperature=0.8, top_p=0.9``), checked once.

Rows (of a batch) that produce an end id (``eos_id``: one id or several, e.g. a chat template's end of turn) are
finished: their later positions are filled with that id, and generation stops as soon as every row is finished.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from contextlib import closing
from typing import Any

import torch
from torch import Tensor

from qkv.decoding.configs import decoder_config
from qkv.decoding.engine import Engine
from qkv.decoding.fast_step import bucket, resolve_step
from qkv.decoding.prompt_lookup import check_cached
from qkv.decoding.request import Request
from qkv.decoding.sampling_params import SamplingParams
from qkv.errors import QkvError
from qkv.models.eval_mode import eval_mode
from qkv.tokenizers.base import Tokenizer

Prompt = Sequence[int] | Sequence[Sequence[int]] | Tensor
EndIds = int | Iterable[int] | None


def _check_id(name: str, value: int, vocab_size: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise QkvError(
            f"{name}={value!r} is not a token id of this model (0..{vocab_size - 1}): "
            f"pass the tokenizer's {name} (e.g. tokenizer.{name}) or None"
        )


def end_ids(eos_id: EndIds, vocab_size: int) -> frozenset[int]:
    """``eos_id`` (None, one id, or several) as a checked set of ids that end a row."""
    if eos_id is None:
        return frozenset()
    ids = [eos_id] if isinstance(eos_id, int) else list(eos_id)
    for i in ids:
        _check_id("eos_id", i, vocab_size)
    return frozenset(ids)


def prompt_tensor(model: torch.nn.Module, prompt_ids: Prompt, bos_id: int | None) -> Tensor:
    """The prompt as a checked (B, T) long tensor on the model's device; an empty prompt starts from ``bos_id``."""
    vocab_size = decoder_config(model).vocab_size
    if bos_id is not None:
        _check_id("bos_id", bos_id, vocab_size)
    device = next(model.parameters()).device
    if isinstance(prompt_ids, Tensor):
        if prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex or prompt_ids.dtype == torch.bool:
            raise QkvError(f"prompt ids must be integers, got a {prompt_ids.dtype} tensor: pass token ids (long)")
        ids = prompt_ids.to(device=device, dtype=torch.long)
    else:
        try:
            ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
        except (ValueError, TypeError, RuntimeError, OverflowError):
            raise QkvError(
                "the prompt must be a list of token ids, or equal-length lists for a batch: "
                "encode the text with the tokenizer (and pad the rows to one length)"
            ) from None
    if ids.dim() == 1:
        ids = ids[None]  # (T,) -> (1, T)
    if ids.dim() != 2 or ids.shape[0] == 0:
        raise QkvError(f"prompt ids have shape {tuple(ids.shape)}: pass a list of ids or a (batch, length) tensor")
    if ids.shape[1] == 0:
        if bos_id is None:
            raise QkvError(
                "the prompt is empty: give some text, or pass bos_id (e.g. tokenizer.bos_id) "
                "to start from the beginning-of-sequence token"
            )
        ids = torch.full((ids.shape[0], 1), bos_id, dtype=torch.long, device=device)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise QkvError(
            f"the prompt holds ids outside the model's vocabulary (0..{vocab_size - 1}): "
            "encode it with the tokenizer the model was trained with"
        )
    return ids


def cache_length(model: torch.nn.Module, mode: str, kept: int, new: int) -> int:
    """Positions the rows' cache needs: at most kept + new - 1 are fed, never more than the context; the fixed
    shapes of the compiled and graph steps round it up to a power of two (:func:`~qkv.decoding.fast_step.bucket`)."""
    context = decoder_config(model).context_length
    length = min(context, kept + new - 1)
    if mode in ("static", "model", "recompute"):
        return max(length, 1)
    return min(bucket(length, 16), max(length, context))


class TokenStream(Iterator[Tensor]):
    """The new token ids of a batch, one (B,) tensor per step, as the engine makes them. :attr:`cropped` is the
    number of prompt tokens dropped from the left to fit the context (the same for every row); :attr:`passes` the
    model's passes so far (the prefill, then one per engine step: fewer than the tokens with prompt lookup)."""

    def __init__(self, model, ids: Tensor, params: SamplingParams, stops: frozenset[int], use_cache: bool,
                 step: str, generator: torch.Generator | None) -> None:  # fmt: skip
        self.model, self.ids, self.params = model, ids, params
        self.cropped = max(0, ids.shape[1] - model.config.context_length)
        self.passes = 0
        check_cached(params, use_cache)
        mode = resolve_step(model, step) if use_cache else "recompute"
        self._steps = self._run(stops, use_cache, step, generator, mode)

    @torch.no_grad()  # on a generator function, torch applies no_grad only while the generator runs
    def _run(self, stops, use_cache, step, generator, mode) -> Generator[Tensor, None, None]:
        batch, length = self.ids.shape
        new = self.params.max_new_tokens
        if new == 0:
            return
        kept = min(length, self.model.config.context_length)
        if generator is None and self.params.seed is not None:  # one stream for the batch, as a given generator
            generator = torch.Generator(device=self.ids.device).manual_seed(self.params.seed)
        engine = Engine(self.model, batch, cache_length(self.model, mode, kept, new), step=step, use_cache=use_cache)
        rows = [Request(self.ids[b].tolist(), self.params, stops, generator, tag=b) for b in range(batch)]
        made = torch.zeros(batch, dtype=torch.long)
        waiting: list[deque[int]] = [deque() for _ in range(batch)]  # a row's tokens not yet yielded
        ended = [False] * batch

        def take(outputs: list) -> None:  # one or more outputs per row (prompt lookup drafts several tokens)
            for out in outputs:
                if out.error is not None:
                    raise out.error
                waiting[out.request.tag].append(out.token)
                ended[out.request.tag] |= out.finish_reason is not None

        with eval_mode(self.model, no_grad=False), closing(engine):  # eval mode until the stream ends or closes
            take(engine.add(rows))
            self.passes = 1
            for _ in range(new):
                while engine.running and not all(waiting[b] or ended[b] for b in range(batch)):
                    take(engine.step())
                    self.passes += 1
                for b in range(batch):
                    if waiting[b]:
                        made[b] = waiting[b].popleft()  # finished rows keep their last (end) id
                yield made.to(self.ids.device, copy=True)
                if not engine.running and not any(waiting):
                    return

    def __next__(self) -> Tensor:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()


def _start(model, prompt_ids: Prompt, params, ends: tuple[EndIds, int | None], settings: dict[str, Any]) -> TokenStream:
    """Check everything at once (not at the first step) and return the batch's token stream. ``ends`` is (eos_id,
    bos_id); ``settings`` holds the SamplingParams fields given as keywords, and use_cache, step and generator."""
    run = {name: settings.pop(name) for name in ("use_cache", "step", "generator")}
    params = SamplingParams.of(params, **settings)
    if params.stop:
        raise QkvError(
            "stop strings are text, and generate/stream work on token ids: use qkv.complete or qkv.chat, "
            "or pass end ids as eos_id"
        )
    stops = end_ids(ends[0], model.config.vocab_size)
    resolve_step(model, run["step"])
    ids = prompt_tensor(model, prompt_ids, ends[1])
    return TokenStream(model, ids, params, stops, run["use_cache"], run["step"], run["generator"])


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    prompt_ids: Prompt,
    params: SamplingParams | None = None,
    *,
    eos_id: EndIds = None,
    bos_id: int | None = None,
    use_cache: bool = True,
    step: str = "auto",
    generator: torch.Generator | None = None,
    **settings: Any,
) -> Tensor:
    """Continue ``prompt_ids`` with up to ``max_new_tokens`` tokens; returns (B, T + n) token ids.

    ``prompt_ids`` is a list of ids (one sequence), equal-length lists, or a (B, T) / (T,) long tensor. The
    result is the prompt followed by the n <= max_new_tokens new tokens (n < max_new_tokens only when every
    row has produced an end id). An empty prompt starts from ``bos_id`` if given. ``params`` (or its fields as
    keywords: ``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, the penalties, ``seed``) and
    ``generator`` choose each token (temperature 0 is greedy). ``step`` chooses how the cached steps run
    (:mod:`qkv.decoding.fast_step`: "auto" picks the fast step for the device; "model" is the model's own
    forward, the reference); ``use_cache=False`` recomputes every step. Runs in eval mode without gradients and
    restores the model's training flag.
    """
    how = dict(use_cache=use_cache, step=step, generator=generator)
    tokens = _start(model, prompt_ids, params, (eos_id, bos_id), {**settings, **how})
    new = list(tokens)
    if not new:
        return tokens.ids
    return torch.cat([tokens.ids, torch.stack(new, dim=1)], dim=1)  # (B, T + n)


def stream(
    model: torch.nn.Module,
    prompt_ids: Sequence[int] | Tensor,
    params: SamplingParams | None = None,
    *,
    eos_id: EndIds = None,
    bos_id: int | None = None,
    use_cache: bool = True,
    step: str = "auto",
    generator: torch.Generator | None = None,
    **settings: Any,
) -> Iterator[int]:
    """Yield the new token ids of one sequence as they are made (the same ids :func:`generate` returns).

    Arguments are checked at once (a bad one raises here, not at the first ``next``). The end id is yielded too, and
    ends the stream. The returned iterator has ``cropped`` (prompt tokens dropped to fit the context), ``passes``
    (the model's passes so far: fewer than the tokens with ``prompt_lookup``) and ``close()``. Feed the ids to a
    :class:`TextStreamer` to print text as it comes.
    """
    how = dict(use_cache=use_cache, step=step, generator=generator)
    tokens = _start(model, prompt_ids, params, (eos_id, bos_id), {**settings, **how})
    if tokens.ids.shape[0] != 1:
        raise QkvError(f"stream takes one prompt, got a batch of {tokens.ids.shape[0]}: use generate() for a batch")
    return _Ids(tokens)


class _Ids(Iterator[int]):
    """A one-row :class:`TokenStream` as plain ids."""

    def __init__(self, tokens: TokenStream) -> None:
        self.tokens = tokens
        self.cropped = tokens.cropped

    @property
    def passes(self) -> int:
        return self.tokens.passes

    def __next__(self) -> int:
        return int(next(self.tokens)[0])

    def close(self) -> None:
        self.tokens.close()


class TextStreamer:
    """Turns token ids, pushed one at a time, into text that can be printed at once.

    Each :meth:`push` decodes all ids so far and returns the part of the text not returned yet. A byte-level
    BPE token can hold part of a character (a UTF-8 sequence split across tokens); its text then ends with
    the replacement character U+FFFD, and the streamer holds it back until the next token completes it.
    :meth:`flush` returns whatever is still held back. ``prompt_ids`` are decoded first but not returned, so
    the new text joins the prompt as the tokenizer would join it.
    """

    REPLACEMENT = "\ufffd"

    def __init__(self, tokenizer: Tokenizer, *, prompt_ids: Sequence[int] = (), skip_special: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = [int(i) for i in prompt_ids]
        self._shown = len(self._text())  # characters of the text already returned (or part of the prompt)

    def _text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special=self.skip_special)

    def push(self, token_id: int) -> str:
        """Add one token id; return the newly printable text ("" while a character is incomplete)."""
        self.ids.append(int(token_id))
        text = self._text()
        if text.endswith(self.REPLACEMENT):
            return ""
        return self._release(text)

    def flush(self) -> str:
        """Return the text still held back (e.g. a final incomplete character, shown as U+FFFD)."""
        return self._release(self._text())

    def _release(self, text: str) -> str:
        new = text[self._shown :]
        self._shown = max(self._shown, len(text))
        return new
