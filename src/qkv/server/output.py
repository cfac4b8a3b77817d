"""From the engine's token outputs to the text a client reads: detokenizing, stop strings and logprobs.

The decoding engine returns data (:class:`qkv.decoding.engine.TokenOutput`: a token id, its log-probability and
top alternatives, why it finished); this module, run off the model thread, makes text of it, as vLLM's output
processor does. One :class:`ChoiceText` per choice: :meth:`~ChoiceText.opening` (the echoed prompt),
:meth:`~ChoiceText.accept` for each token output, :meth:`~ChoiceText.closing` at the end; each returns
:class:`Piece` s of text with the logprob entries of the tokens whose text they release. A piece is held back
while it may be the start of a stop string (:class:`qkv.decoding.stop.StopText`); a stop string ends the choice
(``finish_reason`` "stop"), and its caller tells the scheduler to free the row.

Log-probabilities are log softmax(logits) of the model's raw logits, as OpenAI reports them: they do not depend on
the sampling settings, which only change which token is drawn. The prompt's (with ``echo``) come from
:func:`qkv.training.perplexity.token_log_probs`, the function ``qkv eval`` sums, so the two agree. The first prompt
token has no logprob (null): nothing comes before it. ``text_offset`` counts characters from the start of the
prompt, with or without ``echo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from qkv.decoding.engine import TokenOutput
from qkv.decoding.generate import TextStreamer
from qkv.decoding.stop import StopText
from qkv.inspect.tokens import token_text
from qkv.tokenizers.base import Tokenizer
from qkv.training.perplexity import token_log_probs


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


def top_dict(tokenizer: Tokenizer, top: list[tuple[int, float]], chosen: int, chosen_lp: float) -> dict[str, float]:
    """{token text: logprob} of the top alternatives, plus the chosen token when it is not among them."""
    out: dict[str, float] = {}
    for i, lp in top:
        out.setdefault(token_text(tokenizer, i), lp)
    out.setdefault(token_text(tokenizer, chosen), chosen_lp)
    return out


def text_offsets(tokenizer: Tokenizer, ids: list[int]) -> list[int]:
    """The character offset at which each token's text begins when ``ids`` are decoded one after another."""
    streamer = TextStreamer(tokenizer, skip_special=False)
    offsets, at = [], 0
    for i in ids:
        offsets.append(at)
        at += len(streamer.push(i))
    return offsets


def prompt_entries(model: nn.Module, tokenizer: Tokenizer, ids: list[int], top: int) -> list[Entry]:
    """The prompt's tokens with their logprobs (the first one null), as ``echo`` returns them (a forward pass:
    run it on the model thread)."""
    scored = token_log_probs(model, ids, top=top)
    offsets = text_offsets(tokenizer, ids)
    entries = [Entry(token_text(tokenizer, ids[0]), None, None, 0)]
    for t in range(1, len(ids)):
        lp = float(scored.logprobs[t - 1])
        alternatives = []
        if top:
            alternatives = list(zip(scored.top_ids[t - 1].tolist(), scored.top_logprobs[t - 1].tolist(), strict=True))
        entries.append(Entry(token_text(tokenizer, ids[t]), lp, top_dict(tokenizer, alternatives, ids[t], lp),
                             offsets[t]))  # fmt: skip
    return entries


class ChoiceText:
    """The text of one choice, made token by token (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, index: int, prompt_text: str, prompt_ids: list[int],
                 stops: tuple[str, ...], logprobs: bool, skip_special: bool = True) -> None:  # fmt: skip
        self.tokenizer, self.index, self.logprobs = tokenizer, index, logprobs
        self.tokens = 0
        self.finish_reason: str | None = None
        self._streamer = TextStreamer(tokenizer, prompt_ids=prompt_ids, skip_special=skip_special)
        self._stop = StopText(list(stops))
        self._base, self._made, self._pending = len(prompt_text), 0, []

    def opening(self, text: str, entries: list[Entry]) -> list[Piece]:
        """The echoed prompt as the first piece."""
        return [Piece(self.index, text, entries)]

    def accept(self, output: TokenOutput) -> list[Piece]:
        """The text a new token releases (held back while it may begin a stop string); sets
        :attr:`finish_reason` once the choice is done (its end id, a stop string, its length)."""
        token = output.token
        assert token is not None
        self.tokens += 1
        if output.finish_reason == "stop":  # an end id: no text of its own
            self.finish_reason = "stop"
            return []
        if self.logprobs and output.logprob is not None:
            top = top_dict(self.tokenizer, list(output.top), token, output.logprob)
            self._pending.append(Entry(token_text(self.tokenizer, token), output.logprob, top,
                                       self._base + self._made))  # fmt: skip
        piece = self._streamer.push(token)
        self._made += len(piece)
        text = self._stop.push(piece)
        entries = _released(self._pending, self._base + self._stop.released)
        if self._stop.stopped:
            self.finish_reason = "stop"
        elif output.finish_reason is not None:
            self.finish_reason = output.finish_reason
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
        if stop.stopped:
            self.finish_reason = "stop"
        return [*out, Piece(self.index, "", [], self.finish_reason or "length")]


def _released(pending: list[Entry], end: int) -> list[Entry]:
    """Take from ``pending`` the entries whose text starts before ``end`` (the text released so far)."""
    n = 0
    while n < len(pending) and pending[n].offset < end:
        n += 1
    out = pending[:n]
    del pending[:n]
    return out


def logprobs_dict(entries: list[Entry]) -> dict:
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [e.top for e in entries],
        "text_offset": [e.offset for e in entries],
    }
