"""The next-token distribution at several temperatures: what the model would say next, and how sure it is.

The GPT notes: the model maps the last vector of the context through W_U to one logit per vocabulary entry, and
a softmax turns them into "a probability distribution over all potential next tokens". Dividing the logits
by a temperature T first reshapes it: T < 1 sharpens it towards the likeliest token, T > 1 flattens it
("more creative generated text"). Dividing by T keeps the order of the logits, so the top tokens are the
same at every T; only their probabilities move. Top-k and top-p then cut the unlikely tail: the numbers
shown are :func:`qkv.decoding.sampling.sampling_distribution`, exactly the distribution generation samples
from (``qkv next``, the playground and ``qkv generate`` share that one function). T = 0 is greedy: all the
mass on the likeliest token.

A GPT reads what generation reads: the last ``context_length`` tokens of the prompt (an empty prompt starts
from ``<bos>``).

For a translator the "context" is the source sentence plus the target written so far: the logits are
those of the decoder's last position after ``<bos>`` + ``target prefix``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from qkv.decoding.sampling import sampling_distribution
from qkv.decoding.sampling_params import SamplingParams
from qkv.errors import QkvError
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import token_label, token_labels
from qkv.inspect.trace import context_length, encode_text
from qkv.layers.softmax import softmax
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
from qkv.models.next_token import next_token_logits

if TYPE_CHECKING:
    from qkv.models.gpt import GPT
    from qkv.models.rnnsearch import RNNSearch
    from qkv.models.transformer import Transformer


@dataclass(repr=False)
class NextToken(ShortRepr):
    """The logits after a context and the top tokens' probabilities at each temperature."""

    context_tokens: list[str]
    logits: np.ndarray  # (vocab,) float64
    temperatures: list[float]
    probabilities: np.ndarray  # (n_temperatures, vocab): softmax(top_p(top_k(logits / T))), rows sum to 1
    top_ids: list[int]  # the top-N token ids, likeliest first (the same order at every T)
    top_tokens: list[str]
    top_k: int | None = None
    top_p: float | None = None
    cropped: int = 0  # prompt tokens before the context window, not read

    @property
    def top_probabilities(self) -> np.ndarray:
        """(n_temperatures, N): the probabilities of the top tokens."""
        return self.probabilities[:, self.top_ids]

    @property
    def model_probabilities(self) -> np.ndarray:
        """(vocab,): softmax(logits), the model's own distribution (T = 1, no filter)."""
        return softmax(torch.from_numpy(self.logits)).numpy()

    def kept(self) -> list[int]:
        """How many tokens keep a probability above 0 at each temperature (after top-k and top-p)."""
        return [int((row > 0).sum()) for row in self.probabilities]

    def entropy(self) -> list[float]:
        """The entropy in nats of each temperature's distribution (higher = flatter)."""
        p = self.probabilities
        return [float(-(row[row > 0] * np.log(row[row > 0])).sum()) for row in p]

    def to_dict(self) -> dict:
        """JSON-ready: the top tokens with logit and probability per temperature, plus the entropies."""
        return {
            "context_tokens": self.context_tokens,
            "cropped": self.cropped,
            "temperatures": self.temperatures,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "top": [
                {
                    "id": i,
                    "token": tok,
                    "logit": float(self.logits[i]),
                    "probabilities": {
                        f"{t:g}": float(self.probabilities[k, i]) for k, t in enumerate(self.temperatures)
                    },
                }
                for i, tok in zip(self.top_ids, self.top_tokens, strict=True)
            ],
            "entropy": {f"{t:g}": h for t, h in zip(self.temperatures, self.entropy(), strict=True)},
            "kept": {f"{t:g}": k for t, k in zip(self.temperatures, self.kept(), strict=True)},
            "vocab_size": int(self.logits.shape[0]),
        }

    def _repr_png_(self) -> bytes:
        """The bars ``qkv next`` draws (:func:`~qkv.inspect.figures.draw_next_token`), one chart per temperature."""
        from qkv.inspect.figures import draw_next_token
        from qkv.inspect.notebook import cached_png, png_bytes

        draw = partial(png_bytes, draw_next_token, self.top_tokens, self.top_probabilities, self.temperatures)
        return cached_png(self, draw)

    def _repr_html_(self) -> str:
        """The table ``qkv next`` prints (:func:`next_token_table`) above its picture."""
        from qkv.inspect.notebook import figure_html, rich_html

        context = "".join(self.context_tokens[-40:])
        table = rich_html(lambda console: console.print(next_token_table(self)), width=110)
        head = f"<p>after <code>{html.escape(context)}</code>:</p>"
        return head + figure_html(self._repr_png_(), alt="next-token distribution", numbers=table)


def check_temperatures(temperatures: Sequence[float]) -> list[float]:
    """The temperatures as floats, each finite and >= 0 (QkvError otherwise); 0 is greedy."""
    values = [float(t) for t in temperatures]
    if not values or any(not math.isfinite(t) or t < 0 for t in values):
        raise QkvError(
            f"temperatures must be numbers >= 0 (0 is greedy), got {list(temperatures)}: e.g. --temperatures 0.5 1 2"
        )
    return values


@torch.no_grad()
def context_logits(
    bundle: ModelBundle, text: str, *, target_prefix: str = "", on_crop: Callable[[int], None] | None = None
) -> tuple[list[str], torch.Tensor]:
    """The context's token labels and the logits (vocab,) of the token after it.

    A GPT continues ``text`` (its last ``context_length`` tokens, as generation reads them: ``on_crop(n)``
    is called with the number n of earlier tokens left out; an empty text starts from ``<bos>``); a
    translator reads ``text`` as the source and continues ``<bos>`` + ``target_prefix``. A model without W_U
    (an encoder, Word2Vec) predicts no next token: the family's refusal.
    """
    model, config = bundle.model, bundle.config
    model.eval()
    device = next(model.parameters()).device
    family = family_of(model)
    family.require("unembedding", "next-token prediction")
    if family.two_vocabularies:  # a translator: the source through the encoder, the target so far through the decoder
        target_tok = bundle.target_tokenizer or bundle.tokenizer
        if target_tok.bos_id is None:
            raise QkvError("the target tokenizer has no <bos> token: a translator needs one to start decoding")
        src = encode_text(bundle.tokenizer, text, limit=context_length(config), what="source text")
        tgt = [target_tok.bos_id, *target_tok.encode(target_prefix)]
        if len(tgt) > context_length(config):
            raise QkvError(
                f"the target prefix is longer than the model's {context_length(config)} positions: shorten it"
            )
        translator = cast("Transformer | RNNSearch", model)
        memory = translator.encode(torch.tensor([src], device=device))
        logits = translator.decode(torch.tensor([tgt], device=device), memory, last_only=True)[0, -1]
        return token_labels(target_tok, tgt), logits
    if target_prefix:
        raise QkvError("--target is for translators: a GPT continues the prompt itself")
    ids = _gpt_context(bundle, text, on_crop)
    gpt = cast("GPT", model)  # a decoder-only model with W_U
    return token_labels(bundle.tokenizer, ids), next_token_logits(gpt, ids)


def _gpt_context(bundle: ModelBundle, text: str, on_crop: Callable[[int], None] | None) -> list[int]:
    """The ids a GPT reads after ``text``: its last context_length tokens, or ``<bos>`` for an empty text."""
    tokenizer = bundle.tokenizer
    ids = tokenizer.encode(text) if text else []
    if not ids:
        if text:
            raise QkvError(f"the prompt {text!r} gives no tokens: give some text")
        if tokenizer.bos_id is None:
            raise QkvError("the prompt is empty and the tokenizer has no <bos> to start from: give some text")
        return [tokenizer.bos_id]
    context = context_length(bundle.config)
    if len(ids) > context:
        if on_crop is not None:
            on_crop(len(ids) - context)
        ids = ids[-context:]
    return ids


def next_token(
    bundle: ModelBundle,
    text: str,
    *,
    temperatures: Sequence[float] = (0.5, 1.0, 2.0),
    top: int = 10,
    target_prefix: str = "",
    top_k: int | None = None,
    top_p: float | None = None,
) -> NextToken:
    """P(next token | text) = softmax(top_p(top_k(logits / T))) for each T, and the ``top`` likeliest tokens.

    The probabilities are :func:`~qkv.decoding.sampling.sampling_distribution` of the model's own
    last-position logits (in float64), so at T = 1 without filters they are exactly softmax(logits), and
    with filters they are what sampling draws from.
    """
    temperatures = check_temperatures(temperatures)
    if top < 1:
        raise QkvError(f"--top {top} must be at least 1")
    filters = SamplingParams(top_k=top_k, top_p=top_p)  # checked once, before the forward pass
    cropped: list[int] = []
    context, logits = context_logits(bundle, text, target_prefix=target_prefix, on_crop=cropped.append)
    logits = logits.double().cpu()
    probabilities = torch.stack(
        [sampling_distribution(logits, filters.replace(temperature=t)) for t in temperatures]
    )  # (n_T, vocab)
    top_ids = torch.argsort(logits, descending=True, stable=True)[:top].tolist()
    tokenizer = bundle.tokenizer
    if family_of(bundle.model).two_vocabularies and bundle.target_tokenizer is not None:
        tokenizer = bundle.target_tokenizer
    return NextToken(
        context_tokens=context,
        logits=logits.numpy(),
        temperatures=temperatures,
        probabilities=probabilities.numpy(),
        top_ids=top_ids,
        top_tokens=[token_label(tokenizer, i) for i in top_ids],
        top_k=top_k or None,
        top_p=top_p if top_p is not None and top_p < 1 else None,
        cropped=sum(cropped),
    )


def next_token_table(result: NextToken, *, digits: int = 4):
    """A rich table: rank, token, logit, and one probability column per temperature."""
    from rich.table import Table
    from rich.text import Text

    table = Table(header_style="bold cyan", show_edge=False, pad_edge=False)
    table.add_column("#", justify="right")
    table.add_column("token")
    table.add_column("id", justify="right", style="dim")
    table.add_column("logit", justify="right")
    for t in result.temperatures:
        table.add_column(f"P (T={t:g})", justify="right")
    top = result.top_probabilities
    for rank, (i, tok) in enumerate(zip(result.top_ids, result.top_tokens, strict=True)):
        cells = [f"{top[k, rank]:.{digits}f}" for k in range(len(result.temperatures))]
        table.add_row(str(rank + 1), Text(tok), str(i), f"{result.logits[i]:.{digits}f}", *cells)
    rest = 1.0 - top.sum(axis=1)
    table.add_row("", Text("(all other tokens)", style="dim"), "", "", *[f"{r:.{digits}f}" for r in rest])
    return table
