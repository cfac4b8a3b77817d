"""Text in, text out: continuing a prompt (:func:`complete`) and answering a conversation (:func:`chat`).

These are the Python form of what ``qkv generate``, ``qkv chat``, ``/v1/completions`` and ``/v1/chat/completions``
do, on the same pieces: the prompt's ids (a chat's rendered by its template, :mod:`qkv.chat_templates`), one row of
the decoding engine (:class:`qkv.decoding.engine.Engine`), and the text layer that detokenizes and checks stop
strings (:class:`qkv.decoding.text.ChoiceText`)::

    import qkv
    bundle = qkv.load("SmolLM2-135M-Instruct.Q4_1.gguf")
    qkv.chat(bundle, [{"role": "user", "content": "What is the capital of France?"}], temperature=0).text
    for piece in qkv.chat_stream(bundle, messages, max_new_tokens=200):   # text as it is made
        print(piece, end="", flush=True)

A chat stops at the end of the assistant's turn (the template's end-of-turn token, e.g. SmolLM2's
``<|im_end|>``), at a stop string, or after ``max_new_tokens``; :attr:`Reply.finish_reason` says which.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any

import torch

from qkv.chat_templates import chat_prompt
from qkv.chat_templates.template import ChatTemplate
from qkv.decoding.configs import decoder_config
from qkv.decoding.engine import Engine
from qkv.decoding.fast_step import resolve_step
from qkv.decoding.generate import cache_length
from qkv.decoding.prompt_lookup import check_cached
from qkv.decoding.request import Request
from qkv.decoding.sampling_params import SamplingParams
from qkv.decoding.text import ChoiceText
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.models.eval_mode import eval_mode
from qkv.models.family import LANGUAGE_MODEL, family_of


@dataclass
class Reply:
    """What a completion or a chat turn made: its ``text``, its new ``token_ids``, why it ended ("stop": an end id
    or a stop string; "length": ``max_new_tokens``), the prompt's length and how many of its tokens were cropped."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cropped: int = 0


class TextStream(Iterator[str]):
    """The new text of one prompt, piece by piece as the engine makes its tokens; :attr:`reply` fills as it goes
    (its ``text``, ``token_ids`` and, at the end, ``finish_reason``)."""

    def __init__(
        self,
        bundle: ModelBundle,
        prompt_ids: list[int],
        params: SamplingParams,
        stop_ids: frozenset[int],
        *,
        step: str = "auto",
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> None:
        model, context = bundle.model, decoder_config(bundle.model).context_length
        self.reply = Reply(prompt_tokens=len(prompt_ids), cropped=max(0, len(prompt_ids) - context))
        check_cached(params, use_cache)
        mode = resolve_step(model, step) if use_cache else "recompute"
        kept = min(len(prompt_ids), context)
        length = cache_length(model, mode, kept, max(params.max_new_tokens, 1))
        self._engine = Engine(model, 1, length, step=step, use_cache=use_cache)
        self._request = Request(prompt_ids, params, stop_ids, generator)
        self._text = ChoiceText(bundle.tokenizer, 0, "", prompt_ids, params.stop, logprobs=False)
        self._pieces = self._run(model)

    @torch.no_grad()  # on a generator function, torch applies no_grad only while the generator runs
    def _run(self, model: torch.nn.Module) -> Generator[str, None, None]:
        engine, text, reply = self._engine, self._text, self.reply
        with eval_mode(model, no_grad=False), closing(engine):
            outputs = engine.add([self._request])
            while outputs:
                for output in outputs:  # one a step, or more with prompt lookup
                    if output.error is not None:
                        raise output.error
                    pieces = text.accept(output) if output.token is not None else []
                    if output.token is not None:
                        reply.token_ids.append(output.token)
                    if text.finish_reason is not None or output.finish_reason is not None:
                        pieces += text.closing()
                    yield from self._emit(pieces)
                    if reply.finish_reason is not None:
                        return
                outputs = engine.step()

    def _emit(self, pieces) -> Generator[str, None, None]:
        for piece in pieces:
            self.reply.text += piece.text
            if piece.finish_reason is not None:
                self.reply.finish_reason = piece.finish_reason
            if piece.text:
                yield piece.text

    def __next__(self) -> str:
        return next(self._pieces)

    def close(self) -> None:
        self._pieces.close()


def _language_model(bundle: ModelBundle, what: str) -> None:
    family_of(bundle.model).require_role(LANGUAGE_MODEL, what)


def complete_stream(
    bundle: ModelBundle,
    prompt: str | list[int],
    params: SamplingParams | None = None,
    *,
    step: str = "auto",
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    **settings: Any,
) -> TextStream:
    """The continuation of ``prompt`` (a text, or token ids), piece by piece; it ends at the tokenizer's end of
    sequence (unless ``ignore_eos``), a stop string or ``max_new_tokens``. Checked at once."""
    _language_model(bundle, "completing text")
    params = SamplingParams.of(params, **settings)
    tokenizer = bundle.tokenizer
    ids = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
    if not ids:
        if tokenizer.bos_id is None:
            raise QkvError("the prompt is empty and the tokenizer has no beginning-of-sequence token: give some text")
        ids = [tokenizer.bos_id]
    vocab_size = decoder_config(bundle.model).vocab_size
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise QkvError(f"the prompt holds ids outside the vocabulary (0..{vocab_size - 1})")
    stops = frozenset() if tokenizer.eos_id is None else frozenset({tokenizer.eos_id})
    return TextStream(bundle, ids, params, stops, step=step, generator=generator, use_cache=use_cache)


def complete(bundle: ModelBundle, prompt: str | list[int], params: SamplingParams | None = None, **kwargs) -> Reply:
    """:func:`complete_stream` to its end: the :class:`Reply`."""
    stream = complete_stream(bundle, prompt, params, **kwargs)
    for _ in stream:
        pass
    return stream.reply


def chat_stream(
    bundle: ModelBundle,
    messages: list[dict[str, Any]],
    params: SamplingParams | None = None,
    *,
    template: ChatTemplate | str | None = None,
    step: str = "auto",
    generator: torch.Generator | None = None,
    **settings: Any,
) -> TextStream:
    """The assistant's answer to ``messages`` (OpenAI's format: {"role", "content"}), piece by piece, rendered with
    the model's chat template (or ``template``) and ending at the template's end of turn. Checked at once."""
    _language_model(bundle, "chat")
    params = SamplingParams.of(params, **settings)
    prompt = chat_prompt(bundle, messages, template=template)
    return TextStream(bundle, prompt.ids, params, frozenset(prompt.stop_ids), step=step, generator=generator)


def chat(bundle: ModelBundle, messages: list[dict[str, Any]], params: SamplingParams | None = None, **kwargs) -> Reply:
    """:func:`chat_stream` to its end: the :class:`Reply` (``reply.text`` is the answer)."""
    stream = chat_stream(bundle, messages, params, **kwargs)
    for _ in stream:
        pass
    return stream.reply
