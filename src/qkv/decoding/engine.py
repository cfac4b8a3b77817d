"""The decoding engine: how generation and translation run their steps, chosen per device.

A decoding loop (:mod:`qkv.decoding.generate`, :mod:`qkv.decoding.beam_search`) opens a *session* for one
request and asks it for next-token logits: ``prefill(ids)`` for a GPT prompt, then ``step(ids)`` for one
new token per row, ``reorder(index)`` when beams move. The ``engine`` argument picks how a session
computes them:

- ``"model"``: the model's own forward with its KV cache (:class:`qkv.layers.kv_cache.KVCache`): the
  reference every other engine is tested against, and the path for any model that presents the interface
  (``new_cache``, ``decode``) without being a qkv GPT or Transformer, or while activations are captured;
- ``"static"``: the fixed-shape step of :mod:`qkv.decoding.decode_step` in eager mode over a static cache
  allocated once for the request (the CPU's default: no compilation to wait for);
- ``"compiled"``: that step through ``torch.compile`` (one graph, no graph breaks, the same graph for
  every position);
- ``"graph"``: that step (eager kernels) captured once as a CUDA graph and replayed for every token, so
  the GPU runs a whole step per launch (the default on CUDA; capture takes milliseconds);
- ``"compiled-graph"``: the compiled step captured as a CUDA graph (fewer, fused kernels; compiling takes
  a while once per shape);
- ``"auto"``: ``"graph"`` on CUDA, ``"static"`` elsewhere, ``"model"`` where the fast step does not apply.

The fast engines keep, per model, the stacked W_q/W_k/W_v copies of :func:`qkv.layers.fused.fuse_linears`
and the compiled step; they are rebuilt when the model's parameters change (another device or dtype, or
an in-place update such as an optimizer step or ``load_state_dict``). For the compiled and graph engines
the cache length and the source length are rounded up to a power of two, so that few shapes (and graphs)
serve all requests; the extra positions are masked. CUDA graphs are kept in a pool, one per shape in use,
so a server reuses them from request to request; a session holds its graph until it is closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from qkv.decoding.decode_step import CrossAttention, cross_attention_keys, gpt_step, transformer_step
from qkv.decoding.encoder_pass import encoder_hidden
from qkv.errors import QkvError
from qkv.layers.capture import is_capturing
from qkv.layers.fused import fuse_linears
from qkv.layers.linear import onednn_rows
from qkv.models.encoder import Encoder
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer

ENGINES = ("auto", "model", "static", "compiled", "graph", "compiled-graph")
GRAPH_ENGINES = ("graph", "compiled-graph")
COMPILE_BACKEND = "inductor"  # torch.compile's backend for the compiled engines (tests use a quicker one)


def resolve_engine(model: nn.Module, engine: str = "auto") -> str:
    """The engine that will run: ``engine`` itself, or for "auto" the one for the model's device."""
    if engine not in ENGINES:
        raise QkvError(f"engine={engine!r} is unknown: choose one of {', '.join(ENGINES)}")
    device = next(model.parameters()).device
    if engine in GRAPH_ENGINES and device.type != "cuda":
        raise QkvError(
            f"engine={engine!r} replays CUDA graphs, but the model is on {device.type}: "
            "use 'static' or 'compiled' (or 'auto'), or move the model to a CUDA device"
        )
    if not isinstance(model, (GPT, Transformer, Encoder)) or is_capturing():
        return "model"  # the fast step knows qkv's models; taps need the model's own forward
    if isinstance(model, Encoder):  # one pass over whole sequences: no cache, no steps to compile or replay
        return "model" if engine == "model" else "static"
    if engine == "auto":
        return "graph" if device.type == "cuda" else "static"
    return engine


def _bucket(length: int, smallest: int) -> int:
    """The next power of two >= length (and >= ``smallest``): few shapes for the compiled and graph steps."""
    return max(smallest, 1 << (max(length, 1) - 1).bit_length())


def _signature(model: nn.Module) -> tuple[tuple[int, int, torch.dtype], ...]:
    """Where each parameter and buffer lives and how often it was changed in place (``_version``)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)


class DecodeEngine:
    """What the fast steps keep per model: the stacked projections, the compiled steps, the CUDA graphs."""

    def __init__(self, model: GPT | Transformer | Encoder) -> None:
        self.model = model
        self.signature = _signature(model)
        stack = model.encoder if isinstance(model, Encoder) else model.decoder
        self.projections = [fuse_linears(b.self_attn.query, b.self_attn.key, b.self_attn.value) for b in stack.blocks]
        self._compiled: dict[str, Callable[..., Tensor]] = {}
        self._graphs: dict[tuple, list[StepBuffers]] = {}  # idle captured graphs by shape
        self._lock = threading.Lock()

    def step(
        self,
        token_ids: Tensor,
        position: Tensor,
        buffer: Tensor,
        cross: tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor | None, Tensor | None] | None = None,
        group: int = 1,
        n_keys: int | None = None,
    ) -> Tensor:
        """Next-token logits (B, V) for ``token_ids`` (B,) at ``position`` (1,), with the static cache
        ``buffer`` (n_layers, B, 2, h_kv, L, d_k) and, for an encoder-decoder, the encoder's keys and values."""
        kv = buffer.unbind(0)
        if cross is None:
            return gpt_step(self.model, self.projections, token_ids, position, kv, n_keys)  # type: ignore[arg-type]
        keys, values, mask, empty = cross
        state = CrossAttention(keys, values, mask, group, empty)
        return transformer_step(self.model, self.projections, token_ids, position, kv, state, n_keys)  # type: ignore[arg-type]

    def compiled(self, backend: str = "inductor") -> Callable[..., Tensor]:
        """:meth:`step` through ``torch.compile`` (fullgraph: a graph break is an error, not a slow path)."""
        with self._lock:
            if backend not in self._compiled:
                self._compiled[backend] = torch.compile(self.step, backend=backend, fullgraph=True, dynamic=False)
            return self._compiled[backend]

    def take_graph(self, key: tuple) -> StepBuffers | None:
        with self._lock:
            idle = self._graphs.get(key)
            return idle.pop() if idle else None

    def give_back_graph(self, key: tuple, buffers: StepBuffers) -> None:
        with self._lock:
            self._graphs.setdefault(key, []).append(buffers)


def engine_for(model: GPT | Transformer | Encoder) -> DecodeEngine:
    """The model's engine, made on first use and again whenever its parameters have changed."""
    engine = model.__dict__.get("_decode_engine")
    if engine is None or engine.signature != _signature(model):
        engine = DecodeEngine(model)
        model.__dict__["_decode_engine"] = engine  # a plain attribute: not a submodule, not in the state dict
    return engine


class StepBuffers:
    """Everything a step reads and writes, allocated once: the static KV cache, the position (1,), the new
    token ids (B,), the encoder's keys and values; and, for the graph engines, the captured CUDA graph."""

    def __init__(self, engine: DecodeEngine, batch: int, max_len: int, cross: CrossAttention | None) -> None:
        model = engine.model
        weight = next(p for p in model.parameters() if p.is_floating_point())  # not an int8 matrix
        config = model.config
        self.cache = model.new_cache(max_len)
        self.cache.allocate(batch, config.n_kv_heads, config.head_dim, dtype=weight.dtype, device=weight.device)
        self.layers = self.cache.buffer.unbind(0)  # (B, 2, h_kv, L, d_k) per layer, for the eager step
        self.position = torch.zeros(1, dtype=torch.long, device=weight.device)
        self.tokens = torch.zeros(batch, dtype=torch.long, device=weight.device)
        self.cross = cross
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None

    def cross_args(self) -> tuple | None:
        c = self.cross
        return None if c is None else (tuple(c.keys), tuple(c.values), c.mask, c.empty)

    def capture(self, fn: Callable[..., Tensor], group: int) -> None:
        """Run ``fn`` on these buffers a few times on a side stream (CUDA's rule before capture; it also
        compiles a compiled step), then capture one call as a CUDA graph whose output is ``self.logits``.

        The warm-up writes a key and value at position 0, which the request's first step overwrites."""
        args = (self.tokens, self.position, self.cache.buffer, self.cross_args(), group)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # other requests' threads go on
            self.logits = fn(*args)


class Session:
    """One request's decoding state. ``step`` returns logits (B, V), valid until the next call."""

    length: int

    def prefill(self, token_ids: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, token_ids: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def reorder(self, index: Tensor) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def close(self) -> None:
        """Give back what the session held (its CUDA graph)."""


class ModelSession(Session):
    """The reference: the model's own forward (GPT) or ``decode`` (encoder-decoder) with its KV cache.

    Works for any model with ``new_cache(max_len)`` (a cache with ``length``, ``reset``, ``reorder``) and,
    for translation, ``decode(tgt_ids, memory, memory_padding_mask=, cache=, last_only=)``. The memory
    and its mask are repeated ``group`` times, one copy per beam.
    """

    def __init__(
        self,
        model: nn.Module,
        max_len: int,
        memory: Tensor | None = None,
        memory_padding_mask: Tensor | None = None,
        group: int = 1,
    ) -> None:
        self.model = model
        self.cache = model.new_cache(max_len)
        if memory is not None and group > 1:
            memory = memory.repeat_interleave(group, dim=0)  # (B*k, S, d_model): beam j of sentence b is row b*k + j
            if memory_padding_mask is not None:
                memory_padding_mask = memory_padding_mask.repeat_interleave(group, dim=0)
        self.memory, self.memory_padding_mask = memory, memory_padding_mask

    @property
    def length(self) -> int:
        return self.cache.length

    def _run(self, token_ids: Tensor) -> Tensor:
        if self.memory is None:
            logits = self.model(token_ids, cache=self.cache, last_only=True)
        else:
            logits = self.model.decode(
                token_ids, self.memory, memory_padding_mask=self.memory_padding_mask, cache=self.cache, last_only=True
            )
        return logits[:, -1]  # (B, V)

    def prefill(self, token_ids: Tensor) -> Tensor:
        self.cache.reset()
        return self._run(token_ids)

    def step(self, token_ids: Tensor) -> Tensor:
        return self._run(token_ids[:, None])

    def reorder(self, index: Tensor) -> None:
        self.cache.reorder(index)


class StaticSession(Session):
    """The fast engines: the fixed-shape step over a static cache (see the module docstring)."""

    def __init__(
        self,
        engine: DecodeEngine,
        mode: str,
        batch: int,
        max_len: int,
        cross: CrossAttention | None = None,
    ) -> None:
        self.engine, self.mode, self.length = engine, mode, 0
        backend = COMPILE_BACKEND
        self.group = 1 if cross is None else cross.group
        self._key: tuple | None = None
        if mode in GRAPH_ENGINES:
            source = None if cross is None else (cross.keys[0].shape[2], cross.mask is None, cross.empty is None)
            self._key = (mode, backend, batch, max_len, source, self.group)
            buffers = engine.take_graph(self._key)
            if buffers is None:
                buffers = StepBuffers(engine, batch, max_len, cross)
                fn = engine.step if mode == "graph" else engine.compiled(backend)
                buffers.capture(fn, self.group)
            elif cross is not None:  # a graph made for an earlier request: its inputs are fixed tensors
                assert buffers.cross is not None
                for mine, new in zip(
                    (*buffers.cross.keys, *buffers.cross.values), (*cross.keys, *cross.values), strict=True
                ):
                    mine.copy_(new)
                for mine, new in ((buffers.cross.mask, cross.mask), (buffers.cross.empty, cross.empty)):
                    if mine is not None:
                        mine.copy_(new)
            buffers.cache.reset()
            self._fn: Callable[..., Tensor] | None = None
        else:
            buffers = StepBuffers(engine, batch, max_len, cross)
            self._fn = engine.compiled(backend) if mode == "compiled" else None
        self.buffers = buffers
        self._move_to(0)

    def _move_to(self, length: int) -> None:
        self.length = length
        self.buffers.cache.length = length
        self.buffers.position.fill_(length)

    def prefill(self, token_ids: Tensor) -> Tensor:
        """The prompt (B, T) through the model's own forward, which writes its keys and values into the
        static cache; returns the last position's logits (B, V)."""
        cache = self.buffers.cache
        cache.reset()
        with onednn_rows():  # the prompt's rows through oneDNN's packed product too (up to BATCH_ROWS)
            logits = self.engine.model(token_ids, cache=cache, last_only=True)[:, -1]
        self._move_to(token_ids.shape[1])
        return logits

    def step(self, token_ids: Tensor) -> Tensor:
        b = self.buffers
        if b.graph is not None:
            b.tokens.copy_(token_ids)
            b.graph.replay()
            logits = b.logits
        elif self._fn is not None:  # the ids go through a fixed buffer too: one layout, no recompile for a view
            b.tokens.copy_(token_ids)
            logits = self._fn(b.tokens, b.position, b.cache.buffer, b.cross_args(), self.group)
        else:  # eager: attend over the filled positions only, no mask; a batch's products through oneDNN
            kv = b.layers
            cross = b.cross
            if cross is None:
                with onednn_rows():
                    logits = gpt_step(
                        self.engine.model, self.engine.projections, token_ids, b.position, kv, self.length + 1
                    )  # type: ignore[arg-type]
            else:
                with onednn_rows():
                    logits = transformer_step(
                        self.engine.model,
                        self.engine.projections,
                        token_ids,
                        b.position,
                        kv,
                        cross,
                        self.length + 1,  # type: ignore[arg-type]
                    )
        self._move_to(self.length + 1)
        return logits  # type: ignore[return-value]

    def reorder(self, index: Tensor) -> None:
        """Rows follow their beams, in place (the cross-attention keys belong to the sentence, not the row)."""
        self.buffers.cache.reorder(index, cross_attention=False)

    def close(self) -> None:
        if self._key is not None:
            self.engine.give_back_graph(self._key, self.buffers)
            self._key = None


def encode(model: nn.Module, token_ids: Tensor, padding_mask: Tensor | None = None, *, engine: str = "auto") -> Tensor:
    """An encoder's contextual vectors (B, T, d_model): the model's forward for engine "model", else the
    inference pass of :mod:`qkv.decoding.encoder_pass` (the same numbers, W_q/W_k/W_v in one product)."""
    if resolve_engine(model, engine) == "model":
        return model(token_ids, padding_mask=padding_mask)
    return encoder_hidden(model, engine_for(model).projections, token_ids, padding_mask)  # type: ignore[arg-type]


@contextmanager
def lm_session(model: nn.Module, engine: str, batch: int, max_len: int) -> Iterator[Session]:
    """A session for generating with a GPT: ``batch`` rows, at most ``max_len`` positions fed."""
    mode = resolve_engine(model, engine)
    if mode == "model":
        session: Session = ModelSession(model, max_len)
    else:
        length = max_len if mode == "static" else min(_bucket(max_len, 16), max(max_len, model.config.context_length))
        session = StaticSession(engine_for(model), mode, batch, length)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session.close()


@contextmanager
def translation_session(
    model: nn.Module,
    engine: str,
    memory: Tensor,
    memory_padding_mask: Tensor | None,
    max_len: int,
    *,
    group: int = 1,
) -> Iterator[Session]:
    """A session for decoding targets of ``memory`` (B, S, d_model) with ``group`` rows (beams) per source
    sentence, row b * group + j being beam j of sentence b; at most ``max_len`` target positions fed."""
    mode = resolve_engine(model, engine)
    if mode == "model":
        session: Session = ModelSession(model, max_len, memory, memory_padding_mask, group)
    else:
        fixed = mode != "static"
        cross = cross_attention_keys(
            model,  # type: ignore[arg-type]
            memory,
            memory_padding_mask,
            group=group,
            pad_to=_bucket(memory.shape[1], 8) if fixed else None,
            fixed=fixed,
        )
        length = _bucket(max_len, 16) if fixed else max_len
        session = StaticSession(engine_for(model), mode, memory.shape[0] * group, length, cross)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session.close()


__all__ = [
    "ENGINES",
    "DecodeEngine",
    "ModelSession",
    "Session",
    "StaticSession",
    "encode",
    "engine_for",
    "lm_session",
    "resolve_engine",
    "translation_session",
]
