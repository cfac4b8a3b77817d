"""Translation sessions: one batch of source sentences being translated, step by step, with any strategy.

Beam search and greedy translation (:mod:`qkv.decoding.beam_search`) open a session for a batch of source
sentences (their encoder output, "memory") and ask it for next-token logits: ``prefill`` is not needed (the
target starts from ``<bos>``), ``step(ids)`` feeds one new target token per row, ``reorder(index)`` makes the
rows' cached keys and values follow their beams. The strategy (``step=``, :mod:`qkv.decoding.fast_step`)
decides how a step runs: :class:`ModelSession` is the model's own ``decode`` with its KV cache (the reference),
:class:`StaticSession` the fixed-shape step of :mod:`qkv.decoding.decode_step`, eager, compiled or replayed as a
CUDA graph. Language models decode through :class:`qkv.decoding.engine.Engine` instead, whose rows are
independent requests rather than the beams of one sentence.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from torch import Tensor, nn

from qkv.decoding.decode_step import CrossAttention, cross_attention_keys, transformer_step
from qkv.decoding.encoder_pass import encoder_hidden
from qkv.decoding.fast_step import GRAPH_STEPS, CapturedStep, FastStep, bucket, fast_step_for, resolve_step
from qkv.layers.linear import onednn_rows
from qkv.models.encoder import Encoder
from qkv.models.transformer import Transformer

if TYPE_CHECKING:
    from qkv.models.transformer.config import TransformerConfig


class Session:
    """One batch's decoding state. ``step`` returns logits (B, V), valid until the next call."""

    @property
    def length(self) -> int:  # pragma: no cover - interface
        """Target positions fed so far."""
        raise NotImplementedError

    def step(self, token_ids: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def reorder(self, index: Tensor) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Give back what the session held (its CUDA graph)."""


class CachedDecoder(Protocol):
    """What :class:`ModelSession` needs of a model (Transformer, RNNSearch): a cache of its own kind, and ``decode``
    reading and filling it."""

    def new_cache(self, max_len: int | None = None) -> Any: ...

    def decode(
        self, tgt_ids: Tensor, memory: Tensor, *, memory_padding_mask: Tensor | None = None, cache: Any = None,
        last_only: bool = False,
    ) -> Tensor: ...  # fmt: skip


class ModelSession(Session):
    """The reference: the model's own ``decode`` with its KV cache.

    Works for any model with ``new_cache(max_len)`` (a cache with ``length``, ``reset``, ``reorder``) and
    ``decode(tgt_ids, memory, memory_padding_mask=, cache=, last_only=)``. The memory and its mask are
    repeated ``group`` times, one copy per beam.
    """

    def __init__(
        self, model: nn.Module, max_len: int, memory: Tensor, memory_padding_mask: Tensor | None, group: int = 1
    ) -> None:
        self.model = cast(CachedDecoder, model)
        self.cache = self.model.new_cache(max_len)
        if group > 1:
            memory = memory.repeat_interleave(group, dim=0)  # (B*k, S, d_model): beam j of sentence b is row b*k + j
            if memory_padding_mask is not None:
                memory_padding_mask = memory_padding_mask.repeat_interleave(group, dim=0)
        self.memory, self.memory_padding_mask = memory, memory_padding_mask

    @property
    def length(self) -> int:
        return self.cache.length

    def step(self, token_ids: Tensor) -> Tensor:
        logits = self.model.decode(
            token_ids[:, None], self.memory, memory_padding_mask=self.memory_padding_mask, cache=self.cache,
            last_only=True,
        )  # fmt: skip
        return logits[:, -1]  # (B, V)

    def reorder(self, index: Tensor) -> None:
        self.cache.reorder(index)


class StaticSession(Session):
    """The fast strategies: the fixed-shape step over a static cache (see :mod:`qkv.decoding.fast_step`)."""

    def __init__(self, fast: FastStep, mode: str, batch: int, max_len: int, cross: CrossAttention) -> None:
        self.fast, self.mode, self._length, self.group = fast, mode, 0, cross.group
        model = cast(Transformer, fast.model)  # the fast steps of a translator: an encoder-decoder Transformer
        weight = next(p for p in model.parameters() if p.is_floating_point())  # not an int8 matrix
        self._key: tuple | None = None
        self._fn: Callable[..., Tensor] | None = None
        if mode in GRAPH_STEPS:
            source = (cross.keys[0].shape[2], cross.mask is None, cross.empty is None)
            self._key = (mode, batch, max_len, source, self.group)
            captured = fast.take_graph(self._key)
            if captured is None:
                captured = self._buffers(model, batch, max_len, weight, cross)
                captured.capture(fast.step if mode == "graph" else fast.compiled())
            else:  # a graph made for an earlier batch: its inputs are fixed tensors
                _copy_cross(captured.cross, cross)
        else:
            captured = self._buffers(model, batch, max_len, weight, cross)
            self._fn = fast.compiled() if mode == "compiled" else None
        self.captured = captured
        self.cache = model.new_cache(max_len).use(captured.buffer)  # the static cache, for reorder
        self.layers = captured.buffer.unbind(0)  # (B, 2, h_kv, L, d_k) per layer, for the eager step
        self._move_to(0)

    @staticmethod
    def _buffers(model: Transformer, batch: int, max_len: int, weight: Tensor, cross: CrossAttention) -> CapturedStep:
        config = cast("TransformerConfig", model.config)
        assert config.n_kv_heads is not None, "the config fills n_kv_heads when it is made"
        buffer = model.new_cache(max_len).allocate(
            batch, config.n_kv_heads, config.head_dim, dtype=weight.dtype, device=weight.device
        )
        position = torch.zeros(1, dtype=torch.long, device=weight.device)
        tokens = torch.zeros(batch, dtype=torch.long, device=weight.device)
        return CapturedStep(buffer, tokens, position, cross, cross.group)

    @property
    def length(self) -> int:
        return self._length

    def _move_to(self, length: int) -> None:
        self._length = self.cache.length = length
        self.captured.position.fill_(length)

    def step(self, token_ids: Tensor) -> Tensor:
        c = self.captured
        if c.graph is not None:
            c.tokens.copy_(token_ids)
            logits = c.replay()
        elif self._fn is not None:  # the ids go through a fixed buffer too: one layout, no recompile for a view
            c.tokens.copy_(token_ids)
            logits = self._fn(c.tokens, c.position, c.buffer, c.cross_args(), self.group)
        else:  # eager: attend over the filled positions only, no mask; a batch's products through oneDNN
            model = cast(Transformer, self.fast.model)  # a static session decodes for a Transformer
            with onednn_rows():
                logits = transformer_step(
                    model, self.fast.projections, token_ids, c.position, self.layers, c.cross, self.length + 1
                )  # fmt: skip
        self._move_to(self.length + 1)
        return logits

    def reorder(self, index: Tensor) -> None:
        """Rows follow their beams, in place (the cross-attention keys belong to the sentence, not the row)."""
        self.cache.reorder(index, cross_attention=False)

    def close(self) -> None:
        if self._key is not None:
            self.fast.give_back_graph(self._key, self.captured)
            self._key = None


def _copy_cross(mine: CrossAttention | None, new: CrossAttention) -> None:
    assert mine is not None
    for old, fresh in zip((*mine.keys, *mine.values), (*new.keys, *new.values), strict=True):
        old.copy_(fresh)
    for held, given in ((mine.mask, new.mask), (mine.empty, new.empty)):
        if held is not None:  # the graph's key says which are None: the same for both
            held.copy_(cast(Tensor, given))


def encode(model: nn.Module, token_ids: Tensor, padding_mask: Tensor | None = None, *, step: str = "auto") -> Tensor:
    """An encoder's contextual vectors (B, T, d_model): the model's forward for step "model", else the
    inference pass of :mod:`qkv.decoding.encoder_pass` (the same numbers, W_q/W_k/W_v in one product)."""
    if resolve_step(model, step) == "model":
        return model(token_ids, padding_mask=padding_mask)
    encoder = cast(Encoder, model)  # a fast step other than "model": the family declares an encoder's one pass
    return encoder_hidden(encoder, fast_step_for(model).projections, token_ids, padding_mask)


@contextmanager
def translation_session(
    model: nn.Module,
    step: str,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    max_len: int,
    *,
    group: int = 1,
) -> Iterator[Session]:
    """A session for decoding targets of ``memory`` (B, S, d_model) with ``group`` rows (beams) per source
    sentence, row b * group + j being beam j of sentence b; at most ``max_len`` target positions fed."""
    mode = resolve_step(model, step)
    if mode == "model":
        session: Session = ModelSession(model, max_len, memory, memory_padding_mask, group)
    else:
        fixed = mode != "static"
        cross = cross_attention_keys(
            cast(Transformer, model),  # a fast step for a translator: its family declares the cross-attention step
            memory,
            memory_padding_mask,
            group=group,
            pad_to=bucket(memory.shape[1], 8) if fixed else None,
            fixed=fixed,
        )
        length = bucket(max_len, 16) if fixed else max_len
        session = StaticSession(fast_step_for(model), mode, memory.shape[0] * group, length, cross)
    try:
        yield session
    finally:
        session.close()
