"""Continuous batching: one decoding loop over many requests, each step one batched forward.

Generating for one request at a time runs one forward pass per token per request; a batch of B rows costs
little more than one row (the weights are read once per step either way), so serving many clients means
stepping them together. Their texts differ in length and in where they are, so the batch is rebuilt at
every step, not per request: *iteration-level scheduling* (Orca, Yu et al. 2022; vLLM and Hugging Face TGI
call it continuous batching). A new sequence's prompt is prefilled into a free cache row and it joins the
batch at the next step; a sequence that is done (its length, its end token, a stop string, a client gone)
leaves at once and its row is free for the next.

The KV cache is a pool of fixed *slots*, allocated once: (n_layers, slots, 2, h_kv, L, d_k), one row per
running sequence, L positions each (:meth:`qkv.layers.kv_cache.KVCache.allocate`). The running sequences
are kept in rows 0 .. n-1 (when one leaves, the last moves into its row), so a step reads the first n rows,
a view, and its work follows the number of running sequences, not the pool's size. Each step is
:func:`qkv.decoding.decode_step.gpt_step` with a position per row: every row writes its key and value at
its own position and masks what lies past it (another sequence's leftovers in that row).

Every sequence keeps its own sampling settings and its own ``torch.Generator``, and its row is sampled
alone with them (:func:`qkv.decoding.sampling.sample_next` on its (1, V) logits), so what it draws does not
depend on its neighbours: a seeded sequence gives the same tokens whatever else runs. The loop is the one of
:mod:`qkv.decoding.generate` (prompt cropped to the context, the window sliding past it), one row at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from qkv.decoding.decode_step import gpt_step
from qkv.decoding.engine import engine_for
from qkv.decoding.sampling import sample_next
from qkv.layers.kv_cache import KVCache
from qkv.layers.linear import onednn_rows
from qkv.models.gpt import GPT


class Sequence:
    """One text being generated: its prompt, how to choose its tokens, and where its tokens go.

    Subclasses override :meth:`emit` (a new token; return False to stop here), :meth:`finish` (it left
    normally), :meth:`fail` (its own processing raised) and :meth:`cancelled` (its client went away).
    """

    def __init__(
        self,
        prompt: list[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_id: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.prompt, self.max_new_tokens = list(prompt), max_new_tokens
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.eos_id, self.generator = eos_id, generator
        self.tokens: list[int] = []  # the window (the prompt's last C tokens) and the new ones
        self.made = 0

    def emit(self, token: int, logits: Tensor) -> bool:  # pragma: no cover - interface
        """A new token and the raw logits (V,) it was chosen from; False ends the sequence now."""
        return True

    def finish(self) -> None:
        """The sequence left the batch: its length, its end token, :meth:`emit` said stop, or cancelled."""

    def fail(self, error: Exception) -> None:
        """Choosing or emitting one of its tokens raised ``error``: it leaves, the others go on."""

    def cancelled(self) -> bool:
        return False


class Batcher:
    """A pool of ``slots`` cache rows of ``max_len`` positions and the sequences running in them."""

    def __init__(self, model: GPT, slots: int, max_len: int) -> None:
        self.model, self.slots = model, slots
        self.context = model.config.context_length
        self.max_len = min(max_len, self.context)
        self.engine = engine_for(model)
        weight = next(p for p in model.parameters() if p.is_floating_point())
        config = model.config
        cache = model.new_cache(self.max_len)
        self.buffer = cache.allocate(
            slots, config.n_kv_heads, config.head_dim, dtype=weight.dtype, device=weight.device
        )  # fmt: skip  (n_layers, slots, 2, h_kv, L, d_k)
        self.device = weight.device
        self.running: list[Sequence] = []  # sequence i lives in cache row i

    @property
    def free(self) -> int:
        return self.slots - len(self.running)

    @property
    def bytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def positions_used(self) -> int:
        """Cache positions holding a running sequence's keys (the pool's live part)."""
        return sum(min(len(s.tokens), self.max_len) for s in self.running)

    # ------------------------------------------------------------------------------------ joining

    @torch.no_grad()
    def add(self, sequence: Sequence) -> None:
        """Prefill ``sequence``'s prompt into a free row and choose its first token; it joins the batch (the
        next :meth:`step`) unless that token already ends it."""
        self.add_all([sequence])

    @torch.no_grad()
    def add_all(self, sequences: list[Sequence]) -> None:
        """:meth:`add` for several sequences at once: their prompts, right-padded to the longest, go through
        one forward into consecutive free rows (a prompt's padding lies past its own length, where its row's
        later steps write before they read; causal attention keeps it out of the prompt's own positions)."""
        assert len(sequences) <= self.free, "not enough free cache rows: check Batcher.free first"
        joining = []
        for sequence in sequences:
            if sequence.max_new_tokens <= 0:
                sequence.finish()
                continue
            kept = min(len(sequence.prompt), self.context)
            if self.max_len < self.context and kept + sequence.max_new_tokens - 1 > self.max_len:
                sequence.fail(ValueError(f"{kept} prompt tokens and {sequence.max_new_tokens} new ones do not fit "
                                         f"a cache row of {self.max_len} positions: ask for fewer tokens"))  # fmt: skip
                continue
            sequence.tokens = sequence.prompt[len(sequence.prompt) - kept :]
            joining.append(sequence)
        if not joining:
            return
        first = len(self.running)
        self.running.extend(joining)
        try:
            logits = self._prefill_rows(first, [s.tokens for s in joining])  # (k, V)
        except Exception as error:  # noqa: BLE001 - the joining sequences fail; the running ones go on
            for row in reversed(range(first, first + len(joining))):
                self._drop(row)
            for sequence in joining:
                sequence.fail(error)
            return
        for sequence, out in reversed(list(zip(joining, logits.unbind(0), strict=True))):  # drops move later rows
            self._advance(self.running.index(sequence), out)

    def _prefill(self, row: int, tokens: list[int]) -> Tensor:
        """The model's own forward over ``tokens`` (as :meth:`StaticSession.prefill` runs it), writing their
        keys and values into cache row ``row``; the last position's logits (V,)."""
        return self._prefill_rows(row, [tokens])[0]

    def _prefill_rows(self, first: int, prompts: list[list[int]]) -> Tensor:
        """The prompts, right-padded, through the model's own forward into cache rows ``first`` .. ``first +
        k - 1``; the logits at each prompt's last token (k, V)."""
        cache = self._row_cache(first, len(prompts))
        longest = max(len(tokens) for tokens in prompts)
        ids = torch.zeros(len(prompts), longest, dtype=torch.long, device=self.device)
        for i, tokens in enumerate(prompts):
            ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        last = torch.tensor([len(tokens) - 1 for tokens in prompts], device=self.device)
        with onednn_rows():  # a prompt's rows too: oneDNN's packed product (qkv.layers.linear)
            return self.model(ids, cache=cache, at=last)[:, 0]

    def _row_cache(self, row: int, count: int = 1) -> KVCache:
        cache = self.model.new_cache(self.max_len)
        for i, layer in enumerate(cache.self_attention):
            rows = self.buffer[i, row : row + count]
            layer._keys, layer._values = rows[:, 0], rows[:, 1]
        return cache

    # -------------------------------------------------------------------------------------- steps

    @torch.no_grad()
    def drop_cancelled(self) -> int:
        """Free the rows of sequences whose client went away; how many left."""
        gone = [s for s in self.running if s.cancelled()]
        for sequence in gone:
            self._drop(self.running.index(sequence))
            sequence.finish()
        return len(gone)

    @torch.no_grad()
    def step(self) -> None:
        """One batched forward over the running sequences: each feeds its last token at its own position."""
        n = len(self.running)
        if n == 0:
            return
        sliding = [i for i, s in enumerate(self.running) if len(s.tokens) > self.context]
        tokens = [0 if i in sliding else s.tokens[-1] for i, s in enumerate(self.running)]
        positions = [0 if i in sliding else len(s.tokens) - 1 for i, s in enumerate(self.running)]
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)  # (n,)
        position = torch.tensor(positions, dtype=torch.long, device=self.device)  # (n,)
        kv = self.buffer[:, :n].unbind(0)  # (n, 2, h_kv, L, d_k) per layer: views of the first n rows
        try:
            with onednn_rows():  # a few rows: oneDNN on its own layout of the weights (qkv.layers.linear)
                logits = gpt_step(self.model, self.engine.projections, ids, position, kv, max(positions) + 1)
        except Exception as error:  # noqa: BLE001 - the step failed for everyone; the loop goes on
            for i in reversed(range(n)):
                sequence = self.running[i]
                self._drop(i)
                sequence.fail(error)
            return
        rows = list(self.running)
        outputs: list[Tensor] = list(logits.unbind(0))
        for i in sliding:  # past the context the window moves: prefill it afresh, as generate() does
            s = rows[i]
            outputs[i] = self._prefill(i, s.tokens[len(s.tokens) - self.context :])
        for sequence, out in reversed(list(zip(rows, outputs, strict=True))):  # reversed: drops move later rows
            self._advance(self.running.index(sequence), out)

    def _advance(self, row: int, logits: Tensor) -> None:
        """Choose the next token of the sequence in ``row`` from its logits (V,), hand it over, and let the
        sequence leave if it is done."""
        s = self.running[row]
        try:
            token = int(sample_next(logits[None], temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                    generator=s.generator)[0])  # fmt: skip
            s.tokens.append(token)
            s.made += 1
            going = s.emit(token, logits)
        except Exception as error:  # noqa: BLE001 - a bad request fails alone
            self._drop(row)
            s.fail(error)
            return
        if not going or token == s.eos_id or s.made >= s.max_new_tokens:
            self._drop(row)
            s.finish()

    def _drop(self, row: int) -> None:
        """Free cache row ``row`` now: the last running sequence moves into it (its filled positions only)."""
        last = len(self.running) - 1
        if row != last:
            mover = self.running[last]
            filled = min(len(mover.tokens), self.max_len)
            self.buffer[:, row, :, :, :filled] = self.buffer[:, last, :, :, :filled]
            self.running[row] = mover
        self.running.pop()
