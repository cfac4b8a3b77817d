"""Conversations as training data: JSON lines of ``{"messages": [...]}``, each rendered with the model's chat
template into token ids and a mask that is True on the assistant's tokens
(:func:`qkv.chat_templates.chat_training_example`).

A conversation is one example (not cut into windows: each starts where the template starts). Its input is the
ids but the last, its targets the ids but the first, and a target counts in the loss only where the mask is
True, so the model learns to write the assistant's turns and never the system's or the user's (TRL's
assistant-only loss)::

    ids:      <|im_start|> user \\n Hi <|im_end|> \\n <|im_start|> assistant \\n Hello ! <|im_end|>
    targets:  -100 ...                                                      Hello ! <|im_end|>

(``-100`` is ``F.cross_entropy``'s ``ignore_index``.) A batch pads its conversations on the right to the longest
one, with targets -100 there; causal attention never lets a real token see the padding after it. A conversation
longer than ``seq_len + 1`` tokens keeps its first ``seq_len + 1``. The last ``val_fraction`` of the
conversations (at least one, when there are two or more) are held out for validation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from qkv.chat_templates import chat_training_example
from qkv.errors import QkvError

if TYPE_CHECKING:
    from qkv.model_dir import ModelBundle

IGNORE = -100  # the target of a token that is not the assistant's (F.cross_entropy's ignore_index)
EVAL_SEED = 1234


def is_chat_file(path: str | Path | None) -> bool:
    """Whether ``path`` is a JSON lines file whose first record has ``messages``: chat data."""
    if path is None or not str(path).endswith((".jsonl", ".json")) or not Path(path).is_file():
        return False
    with open(path, encoding="utf-8", errors="replace") as file:
        for line in file:
            if line.strip():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(record, dict) and "messages" in record
    return False


def read_conversations(path: str | Path) -> tuple[list[list[dict[str, Any]]], str]:
    """The conversations of a JSON lines file (one ``{"messages": [...]}`` per line) and the file's sha256."""
    path = Path(path)
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise QkvError(f"cannot read the chat data {path} ({error}): give a UTF-8 JSON lines file") from None
    conversations = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise QkvError(f"{path}, line {number}, is not JSON ({error.msg}): write one object per line") from None
        if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
            raise QkvError(f'{path}, line {number}: each line must be {{"messages": [...]}} (a list of messages)')
        conversations.append(record["messages"])
    if not conversations:
        raise QkvError(f'{path} holds no conversations: write one {{"messages": [...]}} per line')
    return conversations, hashlib.sha256(data).hexdigest()


def encode_conversations(
    bundle: ModelBundle, conversations: list[list[dict[str, Any]]], seq_len: int, *, where: str
) -> list[tuple[Tensor, Tensor]]:
    """(ids, targets) of each conversation, cut to ``seq_len + 1`` tokens: ids (n,) and targets (n - 1,), the
    next token where it is the assistant's, else -100. A conversation whose assistant tokens all lie past the cut
    is a QkvError (it would teach nothing)."""
    examples = []
    for number, messages in enumerate(conversations, start=1):
        try:
            ids, mask = chat_training_example(bundle, messages)
        except QkvError as error:
            raise QkvError(f"{where}, conversation {number}: {error}") from None
        ids, mask = ids[: seq_len + 1], mask[: seq_len + 1]
        ids_t = torch.tensor(ids, dtype=torch.long)
        targets = torch.where(torch.tensor(mask[1:], dtype=torch.bool), ids_t[1:], IGNORE)
        if not bool((targets != IGNORE).any()):
            raise QkvError(
                f"{where}, conversation {number}: its assistant turn starts after the first {seq_len} tokens, so "
                "nothing of it would be learned: raise --seq-len or shorten the conversation"
            )
        examples.append((ids_t, targets))
    return examples


def pad_batch(examples: list[tuple[Tensor, Tensor]], pad_id: int) -> tuple[Tensor, Tensor]:
    """(x, y) (B, T): each example's input ids and targets, padded on the right (x with ``pad_id``, y with -100)."""
    length = max(len(ids) - 1 for ids, _ in examples)
    x = torch.full((len(examples), length), pad_id, dtype=torch.long)
    y = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    for row, (ids, targets) in enumerate(examples):
        x[row, : len(ids) - 1] = ids[:-1]
        y[row, : len(targets)] = targets
    return x, y


class ChatBatches:
    """Random training batches of conversations and fixed validation batches (the held-out conversations).

    ``generator`` draws the training conversations (with replacement, as the text windows are drawn) and goes
    into checkpoints for an exact resume; under torchrun each process keeps its rows of every global batch."""

    def __init__(
        self, examples: list[tuple[Tensor, Tensor]], *, pad_id: int, val_fraction: float = 0.1, seed: int = 0
    ) -> None:
        n_val = int(len(examples) * val_fraction) if len(examples) > 1 else 0
        n_val = max(n_val, 1) if val_fraction > 0 and len(examples) > 1 else n_val
        self.train, self.val = examples[: len(examples) - n_val], examples[len(examples) - n_val :]
        self.pad_id, self.seed = pad_id, seed
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def n_train_tokens(self) -> int:
        """Assistant tokens the training conversations teach (targets that count)."""
        return sum(int((t != IGNORE).sum()) for _, t in self.train)

    @property
    def n_val_tokens(self) -> int:
        return sum(int((t != IGNORE).sum()) for _, t in self.val)

    def train_batch(self, batch_size: int, *, rank: int = 0, world_size: int = 1) -> tuple[Tensor, Tensor]:
        picks = torch.randint(len(self.train), (batch_size * world_size,), generator=self.generator)
        mine = picks[rank * batch_size : (rank + 1) * batch_size]
        return pad_batch([self.train[int(i)] for i in mine], self.pad_id)

    def eval_batches(self, n_batches: int, batch_size: int) -> Iterator[tuple[Tensor, Tensor]]:
        """The held-out conversations in order, ``batch_size`` at a time, at most ``n_batches`` batches; the
        training conversations (drawn with a fixed seed) when nothing is held out."""
        if self.val:
            examples = self.val
        else:
            order = torch.randint(
                len(self.train), (n_batches * batch_size,), generator=torch.Generator().manual_seed(EVAL_SEED)
            )
            examples = [self.train[int(i)] for i in order]
        for start in range(0, min(len(examples), n_batches * batch_size), batch_size):
            yield pad_batch(examples[start : start + batch_size], self.pad_id)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "seed": self.seed, "n_train": len(self.train)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n_train") != len(self.train):
            raise QkvError(
                f"the saved batch state is for {state.get('n_train')} training conversations, but this data has "
                f"{len(self.train)}: resume with the same --data and --val-fraction"
            )
        self.generator.set_state(state["generator"].cpu())
