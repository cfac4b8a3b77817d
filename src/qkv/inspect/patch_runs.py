"""The patched runs of activation patching, batched: many patches through the model in one forward pass.

Every patch (:class:`Patch`) is one or more runs of the corrupt input with one activation, in one block,
replaced by the clean run's value for those runs only. :class:`PatchRuns` puts the patches of one stream side
by side in a batch of up to about :data:`TOKENS` tokens and runs the model once for all of them, because a few
large products use a CPU far better than many small ones.

Two shortcuts keep every run the model's own forward pass (:func:`~qkv.layers.capture.intervene`) while
computing less:

- a patch in block ``row`` (or in the stream after ``row`` blocks) leaves blocks 0..row-1 as the corrupt run
  had them, so a batch starts at its first patch's block: the stream enters it as the corrupt run left it
  (captured once) and the earlier blocks are skipped (:func:`~qkv.inspect.residual.resume_at`);
- in a language model, positions before the first token where the prompts differ are the same in every run
  (causal attention: nothing there sees the difference, and no patch changes them), so their keys and values
  are computed once, from the corrupt prompt, and every run computes only the positions from that token on,
  reading the earlier ones from a KV cache as generation does;
- only the last position's logits are scored, so W_U reads that position alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.inspect.residual import Stream, resume_at, run_model
from qkv.layers.capture import intervene
from qkv.layers.kv_cache import KVCache

if TYPE_CHECKING:
    from qkv.models.gpt import GPT

TOKENS = 2048  # tokens per forward pass (runs x positions), at most MAX_RUNS runs
MAX_RUNS = 64
Progress = Callable[[int, int], None]  # (runs done, runs in all)


@dataclass(frozen=True)
class Patch:
    """Runs of the corrupt input whose activation ``site``, in block ``row`` (or the stream after ``row``
    blocks), is changed in place by ``edit`` on those runs' rows of the batch; ``slots`` are the runs' places
    in the map (row-major)."""

    row: int
    site: str
    slots: list[int]
    edit: Callable[[Tensor, int], None]  # (the runs' rows of the activation, the first position computed)

    @property
    def runs(self) -> int:
        return len(self.slots)


def _differs(clean: Tensor, corrupt: Tensor, dim: int) -> list[int]:
    """The indices along ``dim`` of two (1, ...) activations where the clean and corrupt runs differ at all."""
    changed = (clean != corrupt)[0].movedim(dim - 1, 0)  # (n, ...) without the batch
    return torch.nonzero(changed.flatten(1).any(1))[:, 0].tolist()


def position_patches(stream: Stream, row: int, clean: Tensor, corrupt: Tensor, most: int) -> list[Patch]:
    """The stream after ``row`` blocks, (1, T, d), patched at one position per run, in patches of at most ``most``
    runs. A position where the clean stream equals the corrupt one (every position before the first token that
    differs, in a causal model) would change nothing: it is not run, and its place keeps the corrupt value."""
    length = clean.shape[1]
    differs = _differs(clean, corrupt, 1)
    patches = []
    for first in range(0, len(differs), most):
        positions = torch.tensor(differs[first : first + most], device=clean.device)

        def edit(x: Tensor, first: int, positions: Tensor = positions) -> None:
            x[torch.arange(len(positions)), positions - first] = clean[0, positions].to(x.dtype)  # run k: 1 clean

        patches.append(Patch(row, stream.resid(row), [row * length + int(p) for p in positions], edit))
    return patches


def head_patches(layer: int, site: str, clean: Tensor, corrupt: Tensor) -> list[Patch]:
    """The heads' outputs ``site`` of block ``layer``, (1, H, T, d_k), one head per run (every position at once);
    a head whose output is the same in both runs is not run."""
    heads = torch.tensor(_differs(clean, corrupt, 1), device=clean.device, dtype=torch.long)

    def edit(x: Tensor, first: int) -> None:
        x[torch.arange(len(heads)), heads] = clean[0, heads, first:].to(x.dtype)  # run k: one head clean

    n_heads = clean.shape[1]
    return [Patch(layer, site, [layer * n_heads + int(h) for h in heads], edit)] if len(heads) else []


class PatchRuns:
    """Runs the corrupt input with patches, and scores m = logit(target) - logit(foil) at the last position.

    ``first``: the first position where the clean and corrupt prompts differ, in a language model (0 otherwise);
    the positions before it are read from a KV cache of the corrupt prompt."""

    def __init__(self, model: nn.Module, source: Tensor, prefix: Tensor | None, total: int,
                 progress: Progress | None, *, first: int = 0) -> None:  # fmt: skip
        self.model, self.source, self.prefix = model, source, prefix
        self.target = self.foil = 0
        self.done, self.total, self.progress = 0, total, progress
        self.corrupt: dict[str, Tensor] = {}  # the corrupt run's activations, by name (filled by the caller)
        self.unchanged = 0.0  # the corrupt run's m: what a patch that changes nothing gives
        length = max(source.shape[1] - first, prefix.shape[1] if prefix is not None else 0)
        self.budget = max(1, min(MAX_RUNS, TOKENS // length))  # runs per forward pass
        self.first = first
        self.cached: list[tuple[Tensor, Tensor]] = []  # per block: the corrupt prompt's keys, values before first
        if first > 0:
            cache = cast("GPT", model).new_cache(source.shape[1])  # first > 0 only in a language model
            model(source[:, :first], cache=cache)
            self.cached = [(layer.keys.clone(), layer.values.clone()) for layer in cache.self_attention]

    def logits(self, source: Tensor, prefix: Tensor | None) -> Tensor:
        """The last position's logits (B, vocab) in float64."""
        return run_model(self.model, source, prefix, last_only=True)[:, -1].double()

    def difference(self, logits: Tensor) -> Tensor:
        return logits[:, self.target] - logits[:, self.foil]  # (B,)

    def run(self, stream: Stream, patches: list[Patch], size: int, unchanged: float) -> Tensor:
        """m at each of the ``size`` places of a map: the runs of ``patches`` (all in ``stream``, in block order),
        batched; ``unchanged`` (the corrupt run's m) where no patch runs. (size,)"""
        found = torch.full((size,), unchanged, dtype=torch.float64)
        self.done += size - sum(p.runs for p in patches)  # the places that change nothing count as done
        batch: list[Patch] = []
        for patch in [*patches, None]:
            if batch and (patch is None or sum(p.runs for p in batch) + patch.runs > self.budget):
                found[[slot for p in batch for slot in p.slots]] = self._batch(stream, batch).cpu()
                batch = []
            if patch is not None:
                batch.append(patch)
        return found

    def _batch(self, stream: Stream, patches: list[Patch]) -> Tensor:
        """One forward pass from the first patch's block on, each patch editing its own rows of the batch."""
        start, first = patches[0].row, self.first
        entry = stream.resid(0)  # the embedding's output: the stream entering block ``start``
        sites: dict[str, list[tuple[slice, Callable[[Tensor, int], None]]]] = {entry: []} if start > 0 else {}
        n = 0
        for patch in patches:
            site = entry if patch.site == stream.resid(start) else patch.site  # blocks before start do not run
            sites.setdefault(site, []).append((slice(n, n + patch.runs), patch.edit))
            n += patch.runs
        entering = self.corrupt[stream.resid(start)][:, first:] if start > 0 else None  # (1, T - first, d)

        def editor(site: str, parts: list[tuple[slice, Callable[[Tensor, int], None]]]) -> Callable[[Tensor], Tensor]:
            def edit(t: Tensor) -> Tensor:
                base = entering.expand_as(t) if site == entry and entering is not None else t
                t = base.to(t.dtype, copy=True)
                for rows, change in parts:
                    change(t[rows], first)  # a view: edits this patch's runs in place
                return t

            return edit

        edits = {site: editor(site, parts) for site, parts in sites.items()}
        with intervene(self.model, edits), resume_at(self.model, stream, start):
            if first > 0:  # a language model: the positions from ``first`` on, the earlier ones from the cache
                logits = self.model(self.source[:, first:].expand(n, -1), cache=self._cache(start, n), last_only=True)
                result = self.difference(logits[:, -1].double())
            else:
                prefix = self.prefix.expand(n, -1) if self.prefix is not None else None
                result = self.difference(self.logits(self.source.expand(n, -1), prefix))
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)
        return result

    def _cache(self, start: int, n: int) -> KVCache:
        """A KV cache of blocks ``start``.. holding the corrupt prompt's first positions, for ``n`` runs."""
        kept = self.cached[start:] or self.cached[-1:]  # past the last block: one layer, only to say the length
        cache = KVCache(len(kept), self.source.shape[1])
        for layer, (keys, values) in zip(cache.self_attention, kept, strict=True):
            layer.store(keys.expand(n, -1, -1, -1), values.expand(n, -1, -1, -1))
        return cache
