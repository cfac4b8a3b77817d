"""How well a language model predicts a text: per-token log-probabilities, loss, perplexity and bits per token /
per character.

The text is cut into consecutive windows of ``context_length + 1`` tokens; in each window the model
predicts tokens 1..T from the ones before them (the first token of each window has no prediction, and
consecutive windows share one token, so every token after the first is predicted exactly once). Token t's
log-probability is log softmax(logits)[x_t], the log-softmax of the raw logits (no temperature).

The mean negative log-probability L (nats per predicted token) gives perplexity e^L and bits per token
L / ln 2; bits per character divides the total bits by the number of characters predicted, which compares
models with different tokenizers. ``qkv eval`` and the server's ``echo`` logprobs both come from
:func:`token_log_probs`, so they agree on the same text.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.layers.softmax import log_softmax
from qkv.models.eval_mode import eval_mode
from qkv.models.gpt import GPT
from qkv.tokenizers import Tokenizer


@dataclass
class TokenLogProbs:
    """log P(x_t | the tokens before it in its window) for t = 1..N-1, and optionally the top alternatives."""

    logprobs: Tensor  # (N-1,) float32: the log-probability of each token after the first
    top_ids: Tensor | None = None  # (N-1, k) long: the k likeliest tokens at each position, likeliest first
    top_logprobs: Tensor | None = None  # (N-1, k) float32: their log-probabilities


@dataclass
class TextScore:
    loss: float  # nats per token
    perplexity: float
    bits_per_token: float
    bits_per_char: float
    tokens: int  # tokens predicted
    chars: int  # characters those tokens spell

    def as_dict(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def windows(n_tokens: int, context_length: int) -> list[tuple[int, int]]:
    """The (start, end) token ranges the text is scored in: ``context_length + 1`` tokens, one shared."""
    return [(s, min(s + context_length + 1, n_tokens)) for s in range(0, max(n_tokens - 1, 0), context_length)]


@torch.no_grad()
def token_log_probs(model: GPT, ids: Sequence[int] | Tensor, *, top: int = 0, batch_size: int = 16) -> TokenLogProbs:
    """Per-token log-probabilities of the token ids ``ids`` (N,) under ``model``: (N-1,) values, and with
    ``top`` > 0 the ``top`` likeliest tokens at each position with their log-probabilities."""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten().cpu()
    config = model.config
    spans = windows(ids.numel(), config.context_length)
    device = next(model.parameters()).device
    top = min(top, config.vocab_size)
    chosen, top_ids, top_values = [], [], []
    with eval_mode(model):
        for i in range(0, len(spans), batch_size):
            chunk = [ids[s:e] for s, e in spans[i : i + batch_size]]
            length = max(c.numel() for c in chunk)
            batch = torch.zeros(len(chunk), length, dtype=torch.long)
            for row, c in enumerate(chunk):
                batch[row, : c.numel()] = c
            batch = batch.to(device)
            logprobs = log_softmax(model(batch[:, :-1]))  # (B, T, V): log P(next token) at every position
            picked = logprobs.gather(-1, batch[:, 1:, None])[..., 0]  # (B, T)
            best = logprobs.topk(top, dim=-1) if top else None  # (B, T, k)
            for row, c in enumerate(chunk):
                n = c.numel() - 1
                chosen.append(picked[row, :n].float().cpu())
                if best is not None:
                    top_values.append(best.values[row, :n].float().cpu())
                    top_ids.append(best.indices[row, :n].cpu())
    if not chosen:
        return TokenLogProbs(torch.zeros(0), torch.zeros(0, top, dtype=torch.long), torch.zeros(0, top))
    if not top:
        return TokenLogProbs(torch.cat(chosen))
    return TokenLogProbs(torch.cat(chosen), torch.cat(top_ids), torch.cat(top_values))


def score_text(model: GPT, tokenizer: Tokenizer, text: str, *, batch_size: int = 16) -> TextScore:
    """Loss, perplexity and bits per token/character of ``model`` on ``text``."""
    ids = tokenizer.encode(text)
    if len(ids) < 2:
        raise QkvError("the text has fewer than two tokens: give a longer text to evaluate on")
    logprobs = token_log_probs(model, ids, batch_size=batch_size).logprobs
    total_nats = -float(logprobs.double().sum())
    total_tokens = logprobs.numel()
    total_chars = sum(
        len(tokenizer.decode(ids[s + 1 : e], skip_special=False))
        for s, e in windows(len(ids), model.config.context_length)
    )
    loss = total_nats / total_tokens
    bits = total_nats / math.log(2)
    return TextScore(loss, math.exp(loss), loss / math.log(2), bits / max(total_chars, 1), total_tokens, total_chars)
