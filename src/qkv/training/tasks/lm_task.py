"""Language modelling's loss and evaluation, shared by training from scratch and fine-tuning.

The loss is the cross-entropy between the model's next-token distribution at every position and the token
that actually follows, -log P(x_{t+1} | x_{<=t}), averaged over the positions that count: all of them for
plain text, the assistant's tokens for chat data (targets of -100, F.cross_entropy's ``ignore_index``, count
for nothing: :mod:`qkv.data.chat`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.data.lm import TokenBatches
from qkv.errors import QkvError
from qkv.layers.capture import is_capturing
from qkv.layers.embedding import Unembedding
from qkv.layers.linear_cross_entropy import linear_cross_entropy
from qkv.models.family import family_of
from qkv.sharded import is_sharded
from qkv.storage import unwrap_model

IGNORE = -100  # a target that is not learned (chat data: the system's and the user's tokens, padding)


def language_model_loss(
    model: nn.Module, x: Tensor, y: Tensor, *, label_smoothing: float = 0.0, fused: bool = False
) -> Tensor:
    """The mean next-token cross-entropy of ``model`` on inputs ``x`` and targets ``y`` (B, T). ``fused`` (fine-tuning,
    whose vocabularies are large), with a float W_U held whole (not an FSDP shard) and no label smoothing: W_U and
    the loss run in chunks of rows (:mod:`qkv.layers.linear_cross_entropy`: never every row's logits at once, the
    same products); otherwise through the logits."""
    unembedding = family_of(model).unembedding  # a language model's W_U, by its family's description
    head = unwrap_model(model).get_submodule(unembedding) if unembedding else None
    whole = isinstance(head, Unembedding) and not is_sharded(head.weight)
    if fused and label_smoothing == 0 and whole and not is_capturing():
        assert isinstance(head, Unembedding)  # ``whole`` holds only for one
        return linear_cross_entropy(model(x, unembed=False), head.weight, head.bias, y, ignore_index=IGNORE)
    return next_token_loss(model(x), y, label_smoothing=label_smoothing)


def next_token_loss(logits: Tensor, targets: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy of logits (B, T, V) against target ids (B, T)."""
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), label_smoothing=label_smoothing, ignore_index=IGNORE
    )


class LanguageModelTask:
    """Random windows of the training text; validation loss on fixed windows of the held-out text."""

    higher_is_better = False

    def __init__(
        self,
        batches: TokenBatches,
        *,
        batch_size: int,
        eval_batches: int,
        device: torch.device,
        label_smoothing: float = 0.0,
        fused_loss: bool = False,
    ) -> None:
        self.batches, self.batch_size, self.eval_batches, self.device = batches, batch_size, eval_batches, device
        self.fused_loss = fused_loss  # W_U and the loss in chunks of rows (language_model_loss)
        self.label_smoothing = label_smoothing  # the training loss only: evaluation reports the plain cross-entropy
        self.metric = "val_loss" if batches.n_val_tokens else "train_eval_loss"

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> tuple[Tensor, Tensor]:
        x, y = self.batches.train_batch(self.batch_size, rank=rank, world_size=world_size)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, int]:
        x, y = batch
        loss = language_model_loss(model, x, y, label_smoothing=self.label_smoothing, fused=self.fused_loss)
        return loss, y.numel()

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss over ``eval_batches`` fixed windows (the same windows at every evaluation)."""
        if self.batches.n_val_tokens:
            windows = self.batches.val_batches(self.eval_batches, self.batch_size)
        else:  # no held-out text: fixed windows of the training text, reported under another name
            windows = self.batches.fixed_train_batches(self.eval_batches, self.batch_size)
        total, count = 0.0, 0
        for x, y in windows:
            x, y = x.to(self.device), y.to(self.device)
            total += language_model_loss(model, x, y, fused=self.fused_loss).item() * y.numel()
            count += y.numel()
        return {self.metric: total / max(count, 1)}


def check_seq_len(seq_len: int, context_length: int) -> int:
    """``seq_len`` if the model's context holds it; else a QkvError naming both."""
    if seq_len > context_length:
        raise QkvError(f"--seq-len {seq_len} is longer than the model's context ({context_length} tokens): lower it")
    return seq_len
