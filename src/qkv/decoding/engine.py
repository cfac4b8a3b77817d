"""The decoding engine: one loop that continues many texts at once, one new token per text per step.

Generating means: predict a token, append it, repeat (the GPT notes). With a KV cache the prompt runs through
the model once (*prefill*) and every later step feeds one token per text, whose query attends to the cached keys
and values. A batch of B texts costs little more per step than one (the weights are read once per step either
way), so every road that generates goes through this one loop: :func:`qkv.decoding.generate` and
:func:`~qkv.decoding.stream` (B rows that start together), ``qkv chat``, and the server, whose batch changes at
every step as requests come and go (*iteration-level scheduling*: Orca, Yu et al. 2022; vLLM's and TGI's
continuous batching). A step reads as four verbs, as vLLM's ``EngineCore.step`` does::

    rows, positions = the running requests and where each one is    # 1. schedule
    logits = the model on one token per row                         # 2. execute
    tokens = sample each row with its own settings and generator    # 3. sample
    outputs = [TokenOutput(...)]; finished rows leave               # 4. update, and return data

The engine never calls back into its caller: :meth:`Engine.add` and :meth:`Engine.step` *return* one
:class:`TokenOutput` per row (its token, log-probabilities when asked, why it finished, or the error that ended
it), and the caller routes them (the server turns them into text, stop strings and metrics on its own threads).

**The KV pool.** The cache is one tensor of fixed *slots*, allocated once: (n_layers, slots, 2, h_kv, L, d_k)
(:meth:`qkv.layers.kv_cache.KVCache.allocate`). The running rows are kept in slots 0 .. n-1 (when one leaves,
the last moves into its slot), so a step reads the first n slots, a view, and its work follows the number of
running rows. Each row writes its key and value at its own position and masks what lies past it.

**The context window.** A row conditions on its last ``context_length`` tokens (C). A prompt longer than C is
cropped from the left (:attr:`Request.cropped` says how many tokens were dropped). While a row has at most C
tokens its window is the whole text at positions 0..L-1: one prefill, then one cached token per step. Once it
has more, the window slides: every position changes, so the cached keys no longer hold, and the row's window is
prefilled afresh at each such step, which is the computation of the uncached path. ``use_cache=False`` is that
uncached path for every step: the reference the cached one is tested against.

**Strategies** (``step=``, :mod:`qkv.decoding.fast_step`): "model" runs the model's own forward over each row's
slice of the pool; "native" the whole step in one call to C (:mod:`qkv.decoding.native_step`); "static" the
fixed-shape step of :mod:`qkv.decoding.decode_step` eagerly, over the filled
positions only; "compiled" and the CUDA-graph strategies run it over every slot, with fixed shapes (idle slots
compute at position 0 and are ignored), so that one graph serves every step.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor, nn

from qkv.decoding.configs import decoder_config
from qkv.decoding.decode_step import gpt_step
from qkv.decoding.fast_step import GRAPH_STEPS, CapturedStep, FastStep, fast_step_for, resolve_step
from qkv.decoding.native_step import NativeStep
from qkv.decoding.prompt_lookup import Lookup, checked_step, draft_for
from qkv.decoding.request import Request, TokenOutput
from qkv.decoding.sampling import finite_picks, penalize, sample_next, token_logprobs
from qkv.errors import QkvError
from qkv.layers.linear import onednn_rows
from qkv.models.gpt import GPT
from qkv.models.memory import check_kv_pool, new_tokens_error


@dataclass(eq=False)
class _Row:
    request: Request
    tokens: list[int]  # the window (the prompt's last C tokens) and the new ones
    made: int = 0
    counts: Tensor | None = None  # (V,) how often each token was generated (penalties only)
    seen: Tensor | None = None  # (V,) True where a token is in the text (repetition penalty only)
    lookup: Lookup | None = None  # the text's n-grams (prompt lookup only: qkv.decoding.prompt_lookup)


class Engine:
    """A pool of ``slots`` cache rows of ``max_len`` positions and the requests running in them."""

    def __init__(self, model: nn.Module, slots: int, max_len: int, *, step: str = "auto", use_cache: bool = True):
        self.model = cast(GPT, model)  # any decoder-only model with GPT's interface: config, new_cache, forward
        self.slots = slots
        self.context = decoder_config(model).context_length
        self.max_len = min(max_len, self.context)
        self.mode = resolve_step(model, step) if use_cache else "recompute"
        weight = next(p for p in model.parameters() if p.is_floating_point())  # not an int8 matrix
        self.device, self.vocab_size = weight.device, decoder_config(model).vocab_size
        self.running: list[_Row] = []  # row i lives in slot i
        self._fast: FastStep | None = None  # the model's fast step, looked up (and checked) when requests join
        self.buffer: Tensor | None = None
        self._captured: CapturedStep | None = None
        self._picks = torch.empty(slots, dtype=torch.long)  # the compiled native step's argmaxes, every step
        self._graph_key: tuple | None = None
        if self.mode != "recompute":
            self._allocate(weight)

    @property
    def pool(self) -> Tensor:
        """The KV pool (n_layers, slots, 2, h_kv, L, d_k): allocated when the engine is made, unless it recomputes."""
        assert self.buffer is not None, "the engine recomputes every step: it has no KV pool"
        return self.buffer

    def _allocate(self, weight: Tensor) -> None:
        if self.mode in GRAPH_STEPS:  # a graph captured for an earlier request of this shape, with its pool
            self._graph_key = (self.mode, self.slots, self.max_len)
            self._captured = fast_step_for(self.model).take_graph(self._graph_key)
            if self._captured is not None:
                self.buffer = self._captured.buffer
                return
        config = decoder_config(self.model)
        assert config.n_kv_heads is not None, "the config fills n_kv_heads when it is made"
        check_kv_pool(config, self.slots, self.max_len, weight.dtype, weight.device)
        cache = self.model.new_cache(self.max_len)
        self.buffer = cache.allocate(
            self.slots, config.n_kv_heads, config.head_dim, dtype=weight.dtype, device=weight.device
        )  # fmt: skip  (n_layers, slots, 2, h_kv, L, d_k)

    # ------------------------------------------------------------------------------------ the pool

    @property
    def free(self) -> int:
        return self.slots - len(self.running)

    @property
    def requests(self) -> list[Request]:
        return [row.request for row in self.running]

    @property
    def bytes(self) -> int:
        return 0 if self.buffer is None else self.buffer.numel() * self.buffer.element_size()

    def positions_used(self) -> int:
        """Cache positions holding a running request's keys (the pool's live part)."""
        return sum(min(len(row.tokens), self.max_len) for row in self.running)

    def close(self) -> None:
        """Give back what the engine holds beyond its pool (a captured CUDA graph, for the next request)."""
        if self._captured is not None and self._captured.graph is not None and self._graph_key is not None:
            fast_step_for(self.model).give_back_graph(self._graph_key, self._captured)
        self._captured = None

    # -------------------------------------------------------------------------------------- joining

    @torch.no_grad()
    def add(self, requests: list[Request]) -> list[TokenOutput]:
        """Prefill the requests' prompts (in one forward) into free slots and choose each one's first token."""
        if len(requests) > self.free:
            raise QkvError(f"{len(requests)} requests do not fit the {self.free} free slots: check Engine.free first")
        outputs, joining = [], []
        for request in requests:
            kept = min(len(request.prompt), self.context)
            request.cropped = len(request.prompt) - kept
            if request.generator is None and request.params.seed is not None:
                request.generator = torch.Generator(device=self.device).manual_seed(request.params.seed)
            new = request.params.max_new_tokens
            too_many = new_tokens_error(new)
            if too_many is not None:
                outputs.append(TokenOutput(request, error=too_many))
            elif new == 0 or kept == 0:
                outputs.append(TokenOutput(request, finish_reason="length") if new == 0 else self._empty(request))
            elif self.mode != "recompute" and self.max_len < self.context and kept + new - 1 > self.max_len:
                outputs.append(TokenOutput(request, error=QkvError(
                    f"{kept} prompt tokens and {new} new ones do not fit a cache row of {self.max_len} positions: "
                    "ask for fewer tokens")))  # fmt: skip
            else:
                joining.append(self._row(request, request.prompt[len(request.prompt) - kept :]))
        if not joining:
            return outputs
        first = len(self.running)
        self.running.extend(joining)
        self._fast = None  # checked again at the next step: the weights may have changed since the last request
        try:
            logits = self._prefill(first, [row.tokens for row in joining])  # (k, V)
        except Exception as error:  # noqa: BLE001 - the joining requests fail; the running ones go on
            del self.running[first:]
            return outputs + [TokenOutput(row.request, error=error) for row in joining]
        return outputs + self._advance(list(range(first, first + len(joining))), logits)

    @staticmethod
    def _empty(request: Request) -> TokenOutput:
        return TokenOutput(request, error=QkvError("the prompt is empty: give at least one token"))

    def _row(self, request: Request, tokens: list[int]) -> _Row:
        lookup = Lookup(tokens, request.params.prompt_lookup) if request.params.prompt_lookup else None
        row = _Row(request, list(tokens), lookup=lookup)
        if request.params.penalized:
            row.counts = torch.zeros(self.vocab_size, dtype=torch.int32, device=self.device)
            row.seen = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
            row.seen[torch.tensor(request.prompt, dtype=torch.long, device=self.device)] = True
        return row

    def _prefill(self, first: int, windows: list[list[int]]) -> Tensor:
        """The windows, right-padded, through the model's own forward (into slots ``first`` ..); the logits at
        each window's last token (k, V). Without a cache: the forward alone, windows of one length together."""
        if self.mode == "recompute":
            return self._forward_windows(windows)
        cache = self.model.new_cache(self.max_len).use(self.pool[:, first : first + len(windows)])
        longest = max(len(w) for w in windows)
        ids = torch.zeros(len(windows), longest, dtype=torch.long, device=self.device)
        for i, window in enumerate(windows):
            ids[i, : len(window)] = torch.tensor(window, dtype=torch.long)
        last = None if all(len(w) == longest for w in windows) else torch.tensor([len(w) - 1 for w in windows])
        with onednn_rows() if self.mode != "model" else nullcontext():  # a prompt's rows: oneDNN's packed product
            if last is None:
                return self.model(ids, cache=cache, last_only=True)[:, 0]
            return self.model(ids, cache=cache, at=last.to(self.device))[:, 0]

    def _forward_windows(self, windows: list[list[int]]) -> Tensor:
        out = []
        for group in _runs([len(w) for w in windows]):
            ids = torch.tensor([windows[i] for i in group], dtype=torch.long, device=self.device)
            out.append(self.model(ids, last_only=True)[:, -1])  # (g, V)
        return torch.cat(out)

    # ----------------------------------------------------------------------------------------- steps

    @torch.no_grad()
    def step(self) -> list[TokenOutput]:
        """One token for every running request (one or more with prompt lookup, each its own TokenOutput, in order):
        one batched forward, then each row sampled alone."""
        n = len(self.running)
        if n == 0:
            return []
        rows = list(self.running)
        try:
            drafts = [draft_for(self, row) for row in rows] if self.mode != "recompute" else []
            if any(drafts):  # prompt lookup: drafted tokens checked in this step (qkv.decoding.prompt_lookup)
                return checked_step(self, rows, drafts)
            picks = None
            if self.mode == "recompute":  # no cache: every step is a forward over each row's window
                logits = self._forward_windows([row.tokens[-self.context :] for row in rows])
            else:
                logits, picks = self._cached_step(rows)
        except Exception as error:  # noqa: BLE001 - the step failed for everyone; the engine goes on
            del self.running[:]
            return [TokenOutput(row.request, error=error) for row in rows]
        return self._advance(list(range(n)), logits, picks)

    def _cached_step(self, rows: list[_Row]) -> tuple[Tensor, Tensor | None]:
        """The step's logits (n, V): one batched step, and a fresh prefill of each row whose window slides; and
        the native step's scan of them (each row's argmax, -1 for NaN or inf), where it made one."""
        sliding = [i for i, row in enumerate(rows) if len(row.tokens) > self.context]
        if not sliding:
            return self._execute(rows)
        outs: list[Tensor | None] = (
            [None] * len(rows) if len(sliding) == len(rows) else list(self._execute(rows)[0].unbind(0))
        )
        for i in sliding:  # past the context the window moves: its keys no longer hold
            outs[i] = self._prefill(i, [rows[i].tokens[-self.context :]])[0]
        return torch.stack(cast("list[Tensor]", outs)), None  # every None was a sliding row, filled above

    def _execute(self, rows: list[_Row]) -> tuple[Tensor, Tensor | None]:
        """Next-token logits (n, V) of the running rows, each feeding its last token at its own position; and in
        the native step each row's argmax (-1: NaN or inf), from the step's own read of the logits."""
        n = len(rows)
        positions = [len(r.tokens) - 1 if len(r.tokens) <= self.context else 0 for r in rows]  # sliding rows: 0
        tokens = [r.tokens[-1] if len(r.tokens) <= self.context else 0 for r in rows]
        if self.mode == "model":
            return self._model_step(tokens, positions), None
        if self.mode == "native":  # one call to C for the whole step (qkv.decoding.native_step)
            position = torch.tensor(positions, dtype=torch.long)
            ids = torch.tensor(tokens, dtype=torch.long)
            native = cast(NativeStep, self._fast_step().native())  # resolve_step chose "native": it runs here
            picks = torch.empty(n, dtype=torch.long)
            return native(ids, position, self.pool[:, :n], argmax=picks), picks
        if self.mode == "static":
            kv = self.pool[:, :n].unbind(0)  # (n, 2, h_kv, L, d_k) per layer: views of the first n slots
            same = all(p == positions[0] for p in positions)
            position = torch.tensor(positions[:1] if same else positions, dtype=torch.long, device=self.device)
            ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
            fast = self._fast_step()
            with onednn_rows():  # a few rows: oneDNN on its own layout of the weights (qkv.layers.linear)
                return gpt_step(self.model, fast.projections, ids, position, kv, max(positions) + 1), None
        return self._fixed_step(tokens, positions)

    def _fast_step(self) -> FastStep:
        """The model's :class:`FastStep`: looked up once after requests join (comparing every parameter with the
        one it was made from costs a few hundred microseconds, as much as a small model's step in C), then kept
        while those requests run."""
        if self._fast is None:
            self._fast = fast_step_for(self.model)
        return self._fast

    def _model_step(self, tokens: list[int], positions: list[int]) -> Tensor:
        """The reference: the model's own forward over each run of rows at one position."""
        out = []
        for group in _runs(positions):
            a, b = group[0], group[-1] + 1
            cache = self.model.new_cache(self.max_len).use(self.pool[:, a:b])
            cache.length = positions[a]
            ids = torch.tensor(tokens[a:b], dtype=torch.long, device=self.device)[:, None]  # (g, 1)
            out.append(self.model(ids, cache=cache, last_only=True)[:, -1])
        return torch.cat(out)

    def _fixed_step(self, tokens: list[int], positions: list[int]) -> tuple[Tensor, Tensor | None]:
        """The compiled or graph step over every slot (fixed shapes); idle slots feed token 0 at position 0. The
        logits of the n running rows, and their argmaxes where the compiled step holds the native one."""
        if self._captured is None:
            zeros = torch.zeros(self.slots, dtype=torch.long, device=self.device)
            self._captured = CapturedStep(self.pool, zeros, zeros.clone())
        c, n = self._captured, len(tokens)
        c.tokens.zero_(), c.position.zero_()
        c.tokens[:n] = torch.tensor(tokens, dtype=torch.long)
        c.position[:n] = torch.tensor(positions, dtype=torch.long)
        fast = self._fast_step()
        if self.mode in GRAPH_STEPS:
            if c.graph is None:
                c.capture(fast.step if self.mode == "graph" else fast.compiled())
            return c.replay()[:n], None
        step = fast.compiled()  # made first: where the native step runs, that decides takes_argmax
        picks = self._picks if fast.takes_argmax else None
        logits = step(c.tokens, c.position, c.buffer, None, 1, None, picks)
        return logits[:n], None if picks is None else picks[:n]

    # ------------------------------------------------------------------------------------- sampling

    def _advance(self, slots: list[int], logits: Tensor, picks: Tensor | None = None) -> list[TokenOutput]:
        """Choose the next token of the rows in ``slots`` from their logits (k, V) (and the step's argmaxes, if
        it made them); the finished rows leave."""
        chosen = None if picks is None else picks.tolist()
        outputs: dict[int, TokenOutput] = {}
        for group in _runs(
            [(id(self.running[s].request.params), id(self.running[s].request.generator)) for s in slots]
        ):  # fmt: skip  rows that share settings and a generator: one draw
            rows = [self.running[slots[i]] for i in group]
            try:
                part = None if chosen is None else chosen[group[0] : group[-1] + 1]
                made = self._sample(rows, logits[group[0] : group[-1] + 1], part)
            except Exception as error:  # noqa: BLE001 - a bad request fails alone
                made = [TokenOutput(row.request, error=error) for row in rows]
            outputs.update({slots[i]: out for i, out in zip(group, made, strict=True)})
        for slot in sorted(outputs, reverse=True):  # reversed: leaving moves later rows
            if outputs[slot].finish_reason is not None or outputs[slot].error is not None:
                self._drop(slot)
        return [outputs[slot] for slot in slots]

    def _choose(self, row: _Row, logits: Tensor, pick: int | None = None) -> TokenOutput:
        """Row ``row``'s next token from its logits (1, V) (and their argmax, -1 for NaN or inf, if the step made
        it), or the error that ends it."""
        try:
            return self._sample([row], logits, None if pick is None else [pick])[0]
        except Exception as error:  # noqa: BLE001 - a bad request fails alone
            return TokenOutput(row.request, error=error)

    def _sample(self, rows: list[_Row], logits: Tensor, picks: list[int] | None = None) -> list[TokenOutput]:
        """The rows' next tokens from their logits (k, V); ``picks``: their argmaxes (-1 for NaN or inf), if the
        step read them already."""
        params, generator = rows[0].request.params, rows[0].request.generator
        picks = finite_picks(logits, picks, argmax=params.greedy and not params.penalized)  # greedy: the tokens
        scored = logits
        if params.penalized:
            # a penalized request's row keeps both (_row): (k, V) each
            counts = torch.stack(cast("list[Tensor]", [row.counts for row in rows]))
            seen = torch.stack(cast("list[Tensor]", [row.seen for row in rows]))
            scored = penalize(logits, params, counts, seen)
        tokens = picks if picks is not None else sample_next(scored, params, generator=generator).tolist()
        lps, tops = token_logprobs(logits, tokens, params.logprobs)
        return [self._update(row, token, lp, top) for row, token, lp, top in zip(rows, tokens, lps, tops, strict=True)]

    def _update(self, row: _Row, token: int, logprob: float | None, top: tuple) -> TokenOutput:
        request = row.request
        row.tokens.append(token)
        row.made += 1
        if row.lookup is not None:
            row.lookup.extend([token])
        if row.counts is not None and row.seen is not None:
            row.counts[token] += 1
            row.seen[token] = True
        finish = None
        if token in request.stop_ids and not request.params.ignore_eos:
            finish = "stop"
        elif row.made >= request.params.max_new_tokens:
            finish = "length"
        return TokenOutput(request, token, logprob, top, finish)

    # ------------------------------------------------------------------------------------ leaving

    def abort(self, requests) -> int:
        """Free the slots of ``requests`` (a client gone, a stop string seen); how many were running."""
        gone = {id(r) for r in requests}
        slots = [i for i, row in enumerate(self.running) if id(row.request) in gone]
        for slot in reversed(slots):
            self._drop(slot)
        return len(slots)

    def _drop(self, slot: int) -> None:
        """Free ``slot`` now: the last running row moves into it (its filled positions only)."""
        last = len(self.running) - 1
        if slot != last:
            mover = self.running[last]
            if self.buffer is not None:
                filled = min(len(mover.tokens), self.max_len)
                self.buffer[:, slot, :, :, :filled] = self.buffer[:, last, :, :, :filled]
            self.running[slot] = mover
        self.running.pop()


def _runs(keys: list) -> list[list[int]]:
    """Indices grouped into runs of consecutive equal keys: [1, 1, 2, 1] -> [[0, 1], [2], [3]]."""
    runs: list[list[int]] = []
    for i, key in enumerate(keys):
        if runs and keys[runs[-1][-1]] == key:
            runs[-1].append(i)
        else:
            runs.append([i])
    return runs
