"""The next-token distribution: the model's answer to "what comes next?".

Run the model on the context, keep the logits of the last position (the GPT notes: "the computation to
predict the next token relies entirely on the final vector"), and turn them into probabilities with a
softmax at temperature T.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.layers.softmax import softmax
from qkv.models.eval_mode import eval_mode
from qkv.models.gpt import GPT


@torch.no_grad()
def next_token_logits(model: GPT, token_ids: Tensor | list[int]) -> Tensor:
    """Logits (vocab_size,) [or (B, vocab_size) for a batch] for the token after ``token_ids``."""
    ids = torch.as_tensor(token_ids, dtype=torch.long, device=next(model.parameters()).device)
    single = ids.dim() == 1
    ids = ids[None] if single else ids
    logits = model(ids, last_only=True)[:, -1]  # (B, vocab_size)
    return logits[0] if single else logits


def next_token_distribution(model: GPT, token_ids: Tensor | list[int], temperature: float = 1.0) -> Tensor:
    """P(next token | token_ids) = softmax(logits / T) over the vocabulary."""
    with eval_mode(model):
        return softmax(next_token_logits(model, token_ids), temperature)
