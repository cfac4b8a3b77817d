"""From the engine's token outputs to text: detokenizing, stop strings and log-probability entries.

The decoding engine returns data (:class:`qkv.decoding.engine.TokenOutput`: a token id, its log-probability and
top alternatives, why it finished); this module makes text of it, off the model thread, as vLLM's output
processor does. One :class:`ChoiceText` per text being made: :meth:`~ChoiceText.opening` (an echoed prompt),
:meth:`~ChoiceText.accept` for each token output, :meth:`~ChoiceText.closing` at the end; each returns
:class:`Piece` s of text with the logprob entries of the tokens whose text they release. A piece is held back
while it may be the start of a stop string (:class:`qkv.decoding.stop.StopText`); a stop string ends the text
(``finish_reason`` "stop"), and its caller tells the engine to free the row. ``qkv chat``, ``qkv.complete`` and
the server's completions all make their text here.

Log-probabilities are log softmax(logits) of the model's raw logits, as OpenAI reports them: they do not depend on
the sampling settings, which only change which token is drawn. ``text_offset`` counts characters from the start
of the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qkv.decoding.generate import TextStreamer
from qkv.decoding.request import TokenOutput
from qkv.decoding.stop import StopText
from qkv.tokenizers.base import Tokenizer
from qkv.tokenizers.token_text import token_text


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


class ChoiceText:
    """The text of one choice, made token by token (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, index: int, prompt_text: str, prompt_ids: list[int],
                 stops: tuple[str, ...], logprobs: bool, skip_special: bool = True) -> None:  # fmt: skip
        self.tokenizer, self.index, self.logprobs = tokenizer, index, logprobs
        self.tokens = 0
        self.finish_reason: str | None = None
        self._streamer = TextStreamer(tokenizer, prompt_ids=prompt_ids, skip_special=skip_special)
        self._stop = StopText(list(stops))
        self._base, self._made = len(prompt_text), 0
        self._pending: list[Entry] = []  # log-probability entries whose text is not released yet

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
