"""Generating text with a GPT: predict a token, append it, repeat (the GPT notes; the encoder-decoder notes' "one
token at a time").

Every step runs the model on the sequence so far, keeps the logits of the last position only ("the
computation to predict the next token relies entirely on the final vector", the GPT notes), and picks the next
token with :func:`qkv.decoding.sampling.sample_next` (greedy, temperature, top-k, top-p).

**KV cache.** A causal model never lets a token see its future, so the keys and values of earlier tokens do
not change when a token is appended. With ``use_cache=True`` (the default) the prompt is run once (prefill)
into a preallocated :class:`~qkv.layers.kv_cache.KVCache`, and each later step feeds one token, whose
query attends to the cached keys and values. ``use_cache=False`` recomputes the whole window every step:
slow, but the obvious reference the cached path is tested against. How the cached steps run is the
``engine`` (:mod:`qkv.decoding.engine`): by default a fixed-shape step over a static cache allocated once for
the request (replayed as a CUDA graph on a GPU); ``engine="model"`` runs the model's own forward instead.

**Context window.** The model always conditions on the last ``context_length`` tokens (C), and the two paths
do exactly the same thing at every step:

1. A prompt longer than C is cropped from the left: only its last C tokens are read, and ``on_crop(n)`` is
   called once with the number n of tokens dropped. The returned tensor still starts with the whole prompt.
2. While the sequence (prompt + new tokens) has at most C tokens, the window is the whole sequence at
   positions 0..L-1: one prefill, then one cached token per step.
3. Once it has L > C tokens, the window slides: the next token is predicted from tokens L-C..L-1 at
   positions 0..C-1. Every token's position changes when the window moves (and learned or sinusoidal
   positions are added to the embeddings), so cached keys are no longer valid: the cached path empties its
   cache and prefills the C-token window afresh at each such step, which is the same computation as the
   uncached path. Past the context, caching therefore no longer saves work; keep prompt + new tokens within
   the context to get its speed.

Rows (of a batch) that produce ``eos_id`` are finished: their later positions are filled with ``eos_id``,
and generation stops as soon as every row is finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor

from qkv.decoding.engine import lm_session, resolve_engine
from qkv.decoding.sampling import check_sampling, sample_next
from qkv.errors import QkvError
from qkv.models.eval_mode import eval_mode
from qkv.models.gpt import GPT
from qkv.tokenizers.base import Tokenizer

Prompt = Sequence[int] | Sequence[Sequence[int]] | Tensor


def _check_id(name: str, value: int | None, vocab_size: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise QkvError(
            f"{name}={value!r} is not a token id of this model (0..{vocab_size - 1}): "
            f"pass the tokenizer's {name} (e.g. tokenizer.{name}) or None"
        )


def _prepare(
    model: GPT,
    prompt_ids: Prompt,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    eos_id: int | None,
    bos_id: int | None,
    engine: str,
) -> Tensor:
    """Validate every argument and return the prompt as a (B, T) long tensor on the model's device."""
    vocab_size = model.config.vocab_size
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise QkvError(f"max_new_tokens={max_new_tokens!r} must be a whole number >= 0: e.g. max_new_tokens=100")
    check_sampling(temperature, top_k, top_p)
    _check_id("eos_id", eos_id, vocab_size)
    _check_id("bos_id", bos_id, vocab_size)
    resolve_engine(model, engine)

    device = next(model.parameters()).device
    if isinstance(prompt_ids, Tensor):
        if prompt_ids.dtype.is_floating_point or prompt_ids.dtype.is_complex or prompt_ids.dtype == torch.bool:
            raise QkvError(f"prompt ids must be integers, got a {prompt_ids.dtype} tensor: pass token ids (long)")
        ids = prompt_ids.to(device=device, dtype=torch.long)
    else:
        try:
            ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
        except (ValueError, TypeError):
            raise QkvError(
                "the prompt must be a list of token ids, or equal-length lists for a batch: "
                "encode the text with the tokenizer (and pad the rows to one length)"
            ) from None
    if ids.dim() == 1:
        ids = ids[None]  # (T,) -> (1, T)
    if ids.dim() != 2:
        raise QkvError(f"prompt ids have shape {tuple(ids.shape)}: pass a list of ids or a (batch, length) tensor")
    if ids.shape[1] == 0:
        if bos_id is None:
            raise QkvError(
                "the prompt is empty: give some text, or pass bos_id (e.g. tokenizer.bos_id) "
                "to start from the beginning-of-sequence token"
            )
        ids = torch.full((ids.shape[0], 1), bos_id, dtype=torch.long, device=device)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise QkvError(
            f"the prompt holds ids outside the model's vocabulary (0..{vocab_size - 1}): "
            "encode it with the tokenizer the model was trained with"
        )
    return ids


def _decode_steps(
    model: GPT,
    ids: Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    eos_id: int | None,
    use_cache: bool,
    engine: str,
    generator: torch.Generator | None,
    on_crop: Callable[[int], None] | None,
    on_logits: Callable[[Tensor], None] | None = None,
) -> Iterator[Tensor]:
    """The one decoding loop: yield the next token ids (B,) step by step (see the module docstring)."""
    batch, prompt_length = ids.shape
    context = model.config.context_length
    if prompt_length > context and on_crop is not None:
        on_crop(prompt_length - context)
    if max_new_tokens == 0:
        return
    kept = min(prompt_length, context)
    tokens = ids.new_empty(batch, kept + max_new_tokens)  # the window's tokens and the new ones, in place
    tokens[:, :kept] = ids[:, prompt_length - kept :]
    filled = kept  # tokens written so far
    done = torch.zeros(batch, dtype=torch.bool, device=ids.device) if eos_id is not None else None
    # At most kept + max_new_tokens - 1 tokens are ever fed (the last new token is not), never more than C.
    cached = lm_session(model, engine, batch, min(context, kept + max_new_tokens - 1)) if use_cache else nullcontext()
    with cached as session:
        for step in range(max_new_tokens):
            start = max(0, filled - context)  # the window: the last C tokens
            if session is None:
                logits = model(tokens[:, start:filled], last_only=True)[:, -1]  # (B, V), the whole window
            elif step == 0 or filled > context:
                logits = session.prefill(tokens[:, start:filled])  # prefill (again, once the window slides)
            else:
                logits = session.step(tokens[:, filled - 1])  # one new token per row
            if on_logits is not None:
                on_logits(logits)  # (B, V): the raw logits this step chooses from
            next_ids = sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
            if done is not None:
                next_ids = next_ids.masked_fill(done, eos_id)  # finished rows keep emitting eos
                done |= next_ids == eos_id
            tokens[:, filled] = next_ids
            filled += 1
            yield next_ids  # (B,)
            if done is not None and bool(done.all()):
                return


def _settings(arguments: dict[str, Any]) -> dict[str, Any]:
    """The decoding settings of :func:`generate` or :func:`stream` (their keyword arguments, read from their
    ``locals()`` at entry), passed on as one object instead of thirteen names spelled out twice."""
    return {name: value for name, value in arguments.items() if name not in ("model", "prompt_ids")}


def _start(model: GPT, prompt_ids: Prompt, *, bos_id: int | None, **settings: Any) -> tuple[Tensor, Iterator[Tensor]]:
    """Check the settings (at once, not at the first step) and return the prompt (B, T) and its decoding loop."""
    ids = _prepare(model, prompt_ids, bos_id=bos_id, **{k: settings[k] for k in _PREPARE_SETTINGS})
    return ids, _decode_steps(model, ids, **settings)


_PREPARE_SETTINGS = ("max_new_tokens", "temperature", "top_k", "top_p", "eos_id", "engine")


@torch.no_grad()
def generate(
    model: GPT,
    prompt_ids: Prompt,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    use_cache: bool = True,
    engine: str = "auto",
    generator: torch.Generator | None = None,
    on_crop: Callable[[int], None] | None = None,
    on_logits: Callable[[Tensor], None] | None = None,
) -> Tensor:
    """Continue ``prompt_ids`` with up to ``max_new_tokens`` tokens; returns (B, T + n) token ids.

    ``prompt_ids`` is a list of ids (one sequence), equal-length lists, or a (B, T) / (T,) long tensor. The
    result is the prompt followed by the n <= max_new_tokens new tokens (n < max_new_tokens only when every
    row has produced ``eos_id``). An empty prompt starts from ``bos_id`` if given. ``temperature``,
    ``top_k``, ``top_p`` and ``generator`` choose each token as in :func:`sample_next` (temperature 0 is
    greedy). ``on_crop(n)`` is called once if the prompt is longer than the context and its first n tokens
    cannot be read. ``on_logits(logits)`` is called at every step with the (B, V) logits the next tokens are
    chosen from (raw: before temperature and filters), e.g. to report log-probabilities. ``engine`` chooses
    how the cached steps run (:mod:`qkv.decoding.engine`: "auto" picks the fast step for the device;
    "model" is the model's own forward, the reference). Runs in eval mode without gradients and restores the
    model's training flag.
    """
    ids, steps = _start(model, prompt_ids, **_settings(locals()))
    with eval_mode(model):
        new = list(steps)
    if not new:
        return ids
    return torch.cat([ids, torch.stack(new, dim=1)], dim=1)  # (B, T + n)


def stream(
    model: GPT,
    prompt_ids: Sequence[int] | Tensor,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    bos_id: int | None = None,
    use_cache: bool = True,
    engine: str = "auto",
    generator: torch.Generator | None = None,
    on_crop: Callable[[int], None] | None = None,
    on_logits: Callable[[Tensor], None] | None = None,
) -> Iterator[int]:
    """Yield the new token ids of one sequence as they are made (the same ids :func:`generate` returns).

    Arguments are checked at once (a bad one raises here, not at the first ``next``). The ``eos_id`` token
    is yielded too, and ends the stream; ``on_logits`` sees each step's (1, V) logits just before its id is
    yielded. The model stays in eval mode until the stream is exhausted or closed. Feed the ids to a
    :class:`TextStreamer` to print text as it comes.
    """
    ids, steps = _start(model, prompt_ids, **_settings(locals()))
    if ids.shape[0] != 1:
        raise QkvError(f"stream takes one prompt, got a batch of {ids.shape[0]}: use generate() for a batch")
    return _stream_ids(model, steps)


@torch.no_grad()  # on a generator function, torch applies no_grad only while the generator runs
def _stream_ids(model: GPT, steps: Iterator[Tensor]) -> Iterator[int]:
    with eval_mode(model):
        for next_ids in steps:
            yield int(next_ids[0])


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
