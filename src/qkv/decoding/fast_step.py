"""The step strategies of decoding, and what the fast ones keep per model.

A decoding loop (:mod:`qkv.decoding.engine` for language models, :mod:`qkv.decoding.beam_search` for
translators) asks for next-token logits one step at a time. The ``step`` argument picks how a step runs:

- ``"model"``: the model's own forward with its KV cache (:class:`qkv.layers.kv_cache.KVCache`): the
  reference every other strategy is tested against, and the path for any model whose family declares no fast
  step (:attr:`qkv.models.family.Family.decode_step`), or while activations are captured;
- ``"native"``: a decoder-only model's whole step in one call to C (:mod:`qkv.decoding.native_step`, built
  once per machine by :mod:`qkv.native`), float32 on the CPU with float32, int8 or int4 weights (the CPU's
  default where it applies);
- ``"static"``: the fixed-shape step of :mod:`qkv.decoding.decode_step` in eager mode over a static cache
  allocated once (the CPU's default where the native step does not apply: no compilation to wait for);
- ``"compiled"``: that step through ``torch.compile`` (one graph, no graph breaks, the same graph for
  every position);
- ``"graph"``: that step (eager kernels) captured once as a CUDA graph and replayed for every token, so
  the GPU runs a whole step per launch (the default on CUDA; capture takes milliseconds);
- ``"compiled-graph"``: the compiled step captured as a CUDA graph (fewer, fused kernels; compiling takes
  a while once per shape);
- ``"auto"``: ``"graph"`` on CUDA; on the CPU ``"native"`` where it applies (a decoder-only model in float32,
  a C compiler at hand), else ``"static"``; ``"model"`` where no fast step applies.

:class:`FastStep` keeps, per model, the stacked W_q/W_k/W_v copies of :func:`qkv.layers.fused.fuse_linears`,
the compiled step and a pool of captured CUDA graphs; it is rebuilt when the model's parameters change (another
device or dtype, or an in-place update such as an optimizer step or ``load_state_dict``). For the compiled and
graph strategies cache lengths are rounded up to a power of two (:func:`bucket`), so that few shapes (and
graphs) serve all requests; the extra positions are masked.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.decoding.decode_step import CrossAttention, gpt_step, transformer_step
from qkv.decoding.native_step import NativeStep, native_decode_step, native_step
from qkv.errors import QkvError
from qkv.layers.capture import is_capturing
from qkv.layers.fused import fuse_linears
from qkv.models.family import family_of
from qkv.models.gpt import GPT
from qkv.models.transformer import Transformer

if TYPE_CHECKING:
    from qkv.layers.blocks import DecoderBlock, EncoderBlock
    from qkv.layers.stacks import DecoderStack, EncoderStack

STEPS = ("auto", "model", "native", "static", "compiled", "graph", "compiled-graph")
GRAPH_STEPS = ("graph", "compiled-graph")
COMPILE_BACKEND = "inductor"  # torch.compile's backend for the compiled strategies (tests use a quicker one)


def declared_step(model: nn.Module) -> str | None:
    """The fast step the model's family declares ("causal", "cross", "one-pass"), or None (its own forward)."""
    try:
        return family_of(model).decode_step
    except QkvError:  # not a qkv model: anything with the decoding interface runs its own forward
        return None


def resolve_step(model: nn.Module, step: str = "auto") -> str:
    """The strategy a step will use for ``model``: one of "model", "native", "static", "compiled", "graph",
    "compiled-graph". Unknown names, the CUDA-graph strategies off CUDA, and "native" where it cannot run (with
    the reason) are a QkvError."""
    if step not in STEPS:
        raise QkvError(f"step={step!r} is unknown: choose one of {', '.join(STEPS)}")
    device = next(model.parameters()).device
    if step in GRAPH_STEPS and device.type != "cuda":
        raise QkvError(
            f"step={step!r} replays CUDA graphs, but the model is on {device.type}: "
            "use 'static' or 'compiled' (or 'auto'), or move the model to a CUDA device"
        )
    kind = declared_step(model)
    if kind is None or is_capturing():
        return "model"  # taps need the model's own forward
    if kind == "one-pass":  # an encoder: one pass over whole sequences, no cache, no steps to compile or replay
        return "model" if step == "model" else "static"
    if step == "native" or (step == "auto" and device.type == "cpu" and kind == "causal"):
        found = fast_step_for(model).native() if kind == "causal" else "it runs decoder-only models (GPT, Llama)"
        if isinstance(found, NativeStep):
            return "native"
        if step == "native":
            raise QkvError(f"step='native' cannot run here: {found}; use step='static' (--step static)")
    if step == "auto":
        return "graph" if device.type == "cuda" else "static"
    return step


def bucket(length: int, smallest: int) -> int:
    """The next power of two >= length (and >= ``smallest``): few shapes for the compiled and graph steps."""
    return max(smallest, 1 << (max(length, 1) - 1).bit_length())


def _signature(model: nn.Module) -> tuple[tuple[int, int, torch.dtype], ...]:
    """Where each parameter and buffer lives and how often it was changed in place (``_version``)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return tuple((t.data_ptr(), t._version, t.dtype) for t in tensors)


class FastStep:
    """What the fast steps keep per model: the stacked projections, the compiled step, the CUDA graphs."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.kind = declared_step(model)
        self.signature = _signature(model)
        stack = cast("EncoderStack | DecoderStack", model.encoder if self.kind == "one-pass" else model.decoder)
        blocks = cast("Sequence[EncoderBlock | DecoderBlock]", stack.blocks)  # an nn.ModuleList: plain Modules
        self.projections = [fuse_linears(b.self_attn.query, b.self_attn.key, b.self_attn.value) for b in blocks]
        self._compiled: dict[str, Callable[..., Tensor]] = {}
        self.compile_seconds = 0.0  # the first call of each compiled step, where torch.compile does its work
        self._native: NativeStep | str | None = None
        self._graphs: dict[tuple, list] = {}  # idle captured graphs (with their buffers) by shape
        self._lock = threading.Lock()

    def step(
        self,
        token_ids: Tensor,
        position: Tensor,
        buffer: Tensor,
        cross: tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor | None, Tensor | None] | None = None,
        group: int = 1,
        n_keys: int | None = None,
        argmax: Tensor | None = None,
    ) -> Tensor:
        """Next-token logits (B, V) for ``token_ids`` (B,) at ``position`` (1,) or one per row (B,), with the
        static cache ``buffer`` (n_layers, B, 2, h_kv, L, d_k) and, for an encoder-decoder, the encoder's keys
        and values. Where the native step runs (:attr:`takes_argmax`), ``argmax`` (B,) int64, if given, receives
        each row's argmax from the step's own scan of the logits (-1: NaN or inf); elsewhere it is untouched."""
        if self.takes_argmax and cross is None and token_ids.device.type == "cpu":
            positions = position.expand(token_ids.shape[0])  # one position per row
            handle = cast(NativeStep, self._native).handle
            return native_decode_step(token_ids, positions, buffer, handle, argmax)  # the step as one op
        # the pool itself, not its layers as views: written in place under torch.compile (decode_step.write_kv)
        if cross is None:
            return gpt_step(cast(GPT, self.model), self.projections, token_ids, position, buffer, n_keys)  # "causal"
        keys, values, mask, empty = cross
        state = CrossAttention(keys, values, mask, group, empty)
        model = cast(Transformer, self.model)
        return transformer_step(model, self.projections, token_ids, position, buffer, state, n_keys)

    @property
    def takes_argmax(self) -> bool:
        """Whether :meth:`step` runs the native step (made by :meth:`native` or :meth:`compiled`), which also gives
        each row's argmax."""
        return isinstance(self._native, NativeStep)

    def native(self) -> NativeStep | str:
        """The model's step in C (:mod:`qkv.decoding.native_step`), or the sentence saying why there is none."""
        with self._lock:
            if self._native is None:
                self._native = native_step(cast(GPT, self.model), self.projections)  # what "native" runs
            return self._native

    def compiled(self, backend: str | None = None) -> Callable[..., Tensor]:
        """:meth:`step` through ``torch.compile`` (fullgraph: a graph break is an error, not a slow path). Where
        the native step runs, the compiled graph holds it as one operator (``qkv::native_decode_step``)."""
        backend = backend or COMPILE_BACKEND
        if self.kind == "causal" and next(self.model.parameters()).device.type == "cpu":
            self.native()  # made before tracing, so that the graph calls it
        with self._lock:
            if backend not in self._compiled:
                graph = torch.compile(self.step, backend=backend, fullgraph=True, dynamic=False)
                self._compiled[backend] = self._timed_first_call(backend, graph)
            return self._compiled[backend]

    def _timed_first_call(self, backend: str, graph: Callable[..., Tensor]) -> Callable[..., Tensor]:
        """``graph``, whose first call (the compiling) adds its seconds to :attr:`compile_seconds`; later calls go
        to ``graph`` itself."""

        def first_call(*args: object) -> Tensor:
            start = time.perf_counter()
            out = graph(*args)
            with self._lock:
                self.compile_seconds += time.perf_counter() - start
                self._compiled[backend] = graph
            return out

        return first_call

    def take_graph(self, key: tuple):
        with self._lock:
            idle = self._graphs.get(key)
            return idle.pop() if idle else None

    def give_back_graph(self, key: tuple, graph) -> None:
        with self._lock:
            self._graphs.setdefault(key, []).append(graph)


def fast_step_for(model: nn.Module) -> FastStep:
    """The model's :class:`FastStep`, made on first use and again whenever its parameters have changed."""
    fast = model.__dict__.get("_fast_step")
    if fast is None or fast.signature != _signature(model):
        fast = FastStep(model)
        model.__dict__["_fast_step"] = fast  # a plain attribute: not a submodule, not in the state dict
    return fast


class CapturedStep:
    """A step's inputs and outputs as fixed tensors, and the CUDA graph that reads and writes them.

    ``run(fn)`` calls ``fn(tokens, position, buffer, cross, group)`` on these buffers a few times on a side
    stream (CUDA's rule before capture; it also compiles a compiled step), then captures one call; ``replay``
    runs the graph again, its output in :attr:`logits`."""

    def __init__(
        self,
        buffer: Tensor,
        tokens: Tensor,
        position: Tensor,
        cross: CrossAttention | None = None,
        group: int = 1,
    ) -> None:
        self.buffer, self.tokens, self.position, self.cross, self.group = buffer, tokens, position, cross, group
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: Tensor | None = None

    def cross_args(self) -> tuple | None:
        c = self.cross
        return None if c is None else (tuple(c.keys), tuple(c.values), c.mask, c.empty)

    def capture(self, fn: Callable[..., Tensor]) -> None:
        """Warm ``fn`` up on a side stream, then capture it. The warm-up writes keys and values at the current
        positions, which the request's own steps overwrite."""
        args = (self.tokens, self.position, self.buffer, self.cross_args(), self.group)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):  # other requests' threads go on
            self.logits = fn(*args)

    def replay(self) -> Tensor:
        assert self.graph is not None and self.logits is not None, "capture() first"
        self.graph.replay()
        return self.logits
