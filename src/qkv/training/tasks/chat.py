"""Fine-tuning on conversations: the loss on the assistant's tokens only (:mod:`qkv.data.chat` makes the batches)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from qkv.data.chat import IGNORE, ChatBatches
from qkv.training.tasks.lm_task import language_model_loss


class ChatTask:
    """Random batches of training conversations; the validation loss over the held-out ones, per assistant token."""

    higher_is_better = False

    def __init__(
        self,
        batches: ChatBatches,
        *,
        batch_size: int,
        eval_batches: int,
        device: torch.device,
        label_smoothing: float = 0.0,
    ) -> None:
        self.batches, self.batch_size, self.eval_batches, self.device = batches, batch_size, eval_batches, device
        self.label_smoothing = label_smoothing  # the training loss only: evaluation reports the plain cross-entropy
        self.metric = "val_loss" if batches.val else "train_eval_loss"

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)

    def train_batch(self, rank: int, world_size: int) -> tuple[Tensor, Tensor]:
        x, y = self.batches.train_batch(self.batch_size, rank=rank, world_size=world_size)
        return x.to(self.device), y.to(self.device)

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]) -> tuple[Tensor, int]:
        """Mean cross-entropy over the assistant's tokens of the batch, and how many there are."""
        x, y = batch
        loss = language_model_loss(model, x, y, label_smoothing=self.label_smoothing, fused=True)
        return loss, int((y != IGNORE).sum())

    @torch.no_grad()
    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Mean loss per assistant token over the held-out conversations (the same ones at every evaluation)."""
        total, count = 0.0, 0
        for x, y in self.batches.eval_batches(self.eval_batches, self.batch_size):
            x, y = x.to(self.device), y.to(self.device)
            n = int((y != IGNORE).sum())
            total += language_model_loss(model, x, y, fused=True).item() * n
            count += n
        return {self.metric: total / max(count, 1)}
