"""What the trainer needs from a task (:class:`Task`): batches, a loss to minimise (the mean cross-entropy over a
batch's target tokens for the language model and the translator, -log sigma(u.v) over pairs for Word2Vec), an
evaluation whose metric picks the best model, and where its data stream stands, for an exact resume.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor, nn


class Task(Protocol):
    """What the trainer needs from a task."""

    metric: str  # the evaluation metric that picks the best model, e.g. "val_loss" or "bleu"
    higher_is_better: bool

    def train_batch(self, rank: int, world_size: int) -> Any: ...

    def loss(self, model: nn.Module, batch: Any) -> tuple[Tensor, int]:
        """Mean loss over the batch's target tokens, and their number."""
        ...

    def evaluate(self, model: nn.Module) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]:
        """Where the data stream stands (tensors allowed), for an exact resume."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class UpdatingTask(Task, Protocol):
    """A task that may apply its own optimizer step (Word2Vec's SGD with its gradient written out). The trainer
    uses ``update`` in one process; under torchrun the gradients must be all-reduced, so it uses ``loss`` and the
    optimizer there."""

    def update(self, model: nn.Module, batch: Any) -> tuple[Tensor, int]:
        """One optimizer step on the batch; its mean loss and the number of target tokens."""
        ...
