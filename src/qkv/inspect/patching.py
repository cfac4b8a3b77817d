"""Activation patching: which layers, positions and heads carry the information that decides an answer.

Run the model on a clean prompt and on a corrupted one that differs where it matters ("The Eiffel Tower
is in" vs "The Colosseum is in"). Measure the logit difference m = logit(target) - logit(foil) at the last
position: target is the clean answer, foil the corrupt run's answer. Then rerun the corrupted prompt once
per site, with the activation at that site replaced by its value from the clean run (Meng et al. 2022,
"causal tracing"; Wang et al. 2022), and report how much of the gap that one site recovers:

    recovered = (m_patched - m_corrupt) / (m_clean - m_corrupt)     0 = as corrupt, 1 = as clean

The sites are the residual stream after the embedding and after every block, at every position (a
(layers + 1) x positions map), and every head's output z_h (all positions at once, a layers x heads map).
A translator has two streams: the source sentences are clean and corrupt, its decoder reads the same
target prefix, and both its encoder and decoder (and their self- and cross-attention heads) are patched.

Each patched run is the model's own forward pass with one activation replaced on its way
(:func:`~qkv.layers.capture.intervene`); the runs of one row go through the model as one batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.inspect.answer import one_token
from qkv.inspect.residual import Stream, Sublayer, device_of, run_model, streams
from qkv.inspect.tokens import token_label, token_labels
from qkv.inspect.trace import encode_text
from qkv.layers.capture import capture, intervene
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of

CHUNK = 32  # patched runs per forward pass (one batch)
Progress = Callable[[int, int], None]  # (runs done, runs in all)


@dataclass
class PatchMap:
    """The recovered fraction at every site of one kind: rows x columns (layers x positions or heads)."""

    name: str  # "residual", "heads"; a translator's "encoder residual", ..., "cross heads"
    title: str
    rows: list[str]
    columns: list[str]
    column_axis: str  # "position" or "head"
    values: np.ndarray  # (rows, columns): 0 = corrupt, 1 = clean

    def to_dict(self, digits: int = 6) -> dict:
        return {
            "name": self.name,
            "title": self.title,
            "rows": self.rows,
            "columns": self.columns,
            "column_axis": self.column_axis,
            "values": np.round(self.values, digits).tolist(),
        }


@dataclass
class Patching:
    """Clean and corrupt logit differences, and how much patching each site recovers."""

    kind: str
    clean_tokens: list[str]
    corrupt_tokens: list[str]
    target_id: int
    target_token: str
    foil_id: int
    foil_token: str
    clean_difference: float  # logit(target) - logit(foil) on the clean prompt
    corrupt_difference: float  # ... on the corrupt prompt
    maps: list[PatchMap]
    prefix_tokens: list[str] | None = None  # a translator's decoder input, <bos> first

    def map(self, name: str) -> PatchMap:
        return next(m for m in self.maps if m.name == name)

    def to_dict(self, digits: int = 6) -> dict:
        return {
            "kind": self.kind,
            "clean_tokens": self.clean_tokens,
            "corrupt_tokens": self.corrupt_tokens,
            "prefix_tokens": self.prefix_tokens,
            "target": {"id": self.target_id, "token": self.target_token},
            "foil": {"id": self.foil_id, "token": self.foil_token},
            "clean_difference": round(self.clean_difference, digits),
            "corrupt_difference": round(self.corrupt_difference, digits),
            "maps": [m.to_dict(digits) for m in self.maps],
        }

    def _repr_png_(self) -> bytes:
        """The maps ``qkv patch`` draws (:func:`~qkv.inspect.circuit_figures.draw_patching`)."""
        from qkv.inspect.circuit_views import patching_png

        return patching_png(self)

    def _repr_html_(self) -> str:
        """The maps and each one's strongest site (for notebooks)."""
        from qkv.inspect.circuit_views import patching_html

        return patching_html(self)


class _Runs:
    """Runs the corrupt input, n copies at once, and scores m = logit(target) - logit(foil) at the end."""

    def __init__(self, model: nn.Module, source: Tensor, prefix: Tensor | None, total: int,
                 progress: Progress | None) -> None:  # fmt: skip
        self.model, self.source, self.prefix = model, source, prefix
        self.target = self.foil = 0
        self.done, self.total, self.progress = 0, total, progress

    def logits(self, source: Tensor, prefix: Tensor | None) -> Tensor:
        return run_model(self.model, source, prefix)[:, -1].double()  # (B, vocab): the last position

    def difference(self, logits: Tensor) -> Tensor:
        return logits[:, self.target] - logits[:, self.foil]  # (B,)

    def patched(self, name: str, edit: Callable[[Tensor], Tensor], n: int) -> Tensor:
        """m for ``n`` copies of the corrupt input with ``name`` edited by ``edit``. (n,)"""
        source = self.source.expand(n, -1)
        prefix = self.prefix.expand(n, -1) if self.prefix is not None else None
        with intervene(self.model, {name: edit}):
            result = self.difference(self.logits(source, prefix))
        self.done += n
        if self.progress is not None:
            self.progress(self.done, self.total)
        return result


def _patch_positions(runs: _Runs, name: str, clean: Tensor) -> Tensor:
    """Patch ``name`` (B, T, d) at one position per run, every position in turn. (T,) differences"""
    length = clean.shape[1]
    out = []
    for start in range(0, length, CHUNK):
        positions = torch.arange(start, min(start + CHUNK, length), device=clean.device)
        rows = torch.arange(len(positions), device=clean.device)

        def edit(t: Tensor, positions: Tensor = positions, rows: Tensor = rows) -> Tensor:
            t = t.clone()
            t[rows, positions] = clean[0, positions].to(t.dtype)  # run k takes position k from the clean run
            return t

        out.append(runs.patched(name, edit, len(positions)))
    return torch.cat(out)


def _patch_heads(runs: _Runs, name: str, clean: Tensor) -> Tensor:
    """Patch one head of ``name`` (B, H, T, d_k) per run, at every position. (H,) differences"""
    heads = torch.arange(clean.shape[1], device=clean.device)

    def edit(t: Tensor) -> Tensor:
        t = t.clone()
        t[heads, heads] = clean[0, heads].to(t.dtype)  # run h takes head h from the clean run
        return t

    return runs.patched(name, edit, len(heads))


def _attention_sublayers(stream: Stream) -> list[Sublayer]:
    return [sub for sub in stream.sublayers if sub.attention is not None]


def _stream_maps(
    runs: _Runs,
    stream: Stream,
    acts: dict[str, Tensor],
    columns: list[str],
    recovered: Callable[[Tensor], np.ndarray],
    *,
    named: bool,
) -> list[PatchMap]:
    """The residual map (rows x positions) and one heads map (layers x heads) per kind of attention."""
    prefix = f"{stream.name} " if named else ""  # a translator has an encoder and a decoder stream
    resid = [recovered(_patch_positions(runs, stream.resid(r), acts[stream.resid(r)]))
             for r in range(stream.n_layers + 1)]  # fmt: skip
    title = f"{prefix}residual stream".capitalize()
    maps = [PatchMap(f"{prefix}residual", title, stream.rows, columns, "position", np.stack(resid))]
    for sub in _attention_sublayers(stream):
        name = "cross heads" if sub.kind == "cross" else f"{prefix}heads"
        title = "Cross-attention heads" if sub.kind == "cross" else f"{prefix}self-attention heads".capitalize()
        values = []
        for i in range(stream.n_layers):
            site = stream.attention_act(i, sub, "context")
            values.append(recovered(_patch_heads(runs, site, acts[site])))
        layers = [f"block {i}" for i in range(stream.n_layers)]
        heads = [str(h) for h in range(stream.n_heads)]
        maps.append(PatchMap(name, title, layers, heads, "head", np.stack(values)))
    return maps


def _streams(model: nn.Module) -> list[tuple[Stream, str]]:
    """(stream, which token stream its positions are: "source" or "target") for every stream to patch."""
    family = family_of(model)
    return [(stream, family.side(stream.name)) for stream in streams(model, what="activation patching")]


@torch.no_grad()
def patch(
    bundle: ModelBundle,
    clean: str,
    corrupt: str,
    *,
    target: str | None = None,
    foil: str | None = None,
    prefix: str = "",
    progress: Progress | None = None,
) -> Patching:
    """Patch the residual stream (every layer x position) and every head's output from the ``clean`` run into
    the ``corrupt`` one and report the recovered fraction of logit(target) - logit(foil) at the last position.

    ``target`` defaults to the clean run's top prediction and ``foil`` to the corrupt run's. A translator
    reads ``clean``/``corrupt`` as source sentences and ``prefix`` as the target written so far.
    """
    model, config = bundle.model, bundle.config
    model.eval()
    patched = _streams(model)  # QkvError for a model without W_U or a residual stream
    translator = family_of(model).two_vocabularies  # a source to patch, and a target prefix its decoder reads
    if prefix and not translator:
        raise QkvError("--prefix is for translators: a GPT continues the prompt itself")
    tokenizer = bundle.tokenizer
    out_tokenizer = (bundle.target_tokenizer or tokenizer) if translator else tokenizer
    clean_ids = encode_text(tokenizer, clean, limit=config.context_length, what="clean prompt")
    corrupt_ids = encode_text(tokenizer, corrupt, limit=config.context_length, what="corrupt prompt")
    clean_tokens, corrupt_tokens = token_labels(tokenizer, clean_ids), token_labels(tokenizer, corrupt_ids)
    if len(clean_ids) != len(corrupt_ids):
        raise QkvError(
            f"the clean prompt is {len(clean_ids)} tokens and the corrupt one {len(corrupt_ids)}: patching swaps "
            "activations position by position, so reword one of them to the same token length "
            f"(clean: {' '.join(clean_tokens)} | corrupt: {' '.join(corrupt_tokens)})"
        )
    if clean_ids == corrupt_ids:
        raise QkvError("the clean and corrupt prompts are the same tokens: change the corrupt one where it matters")
    device = device_of(model)
    prefix_ids = None
    if translator:
        if out_tokenizer.bos_id is None:
            raise QkvError("the target tokenizer has no <bos> token: a translator needs one to start decoding")
        decoder_input = [out_tokenizer.bos_id, *out_tokenizer.encode(prefix)]
        if len(decoder_input) > config.context_length:
            raise QkvError(f"--prefix is longer than the model's {config.context_length} positions: shorten it")
        prefix_ids = torch.tensor([decoder_input], device=device)
    source = torch.tensor([clean_ids], device=device)
    corrupted = torch.tensor([corrupt_ids], device=device)

    lengths = {"source": len(clean_ids), "target": prefix_ids.shape[1] if prefix_ids is not None else 0}
    n_runs = sum(
        (stream.n_layers + 1) * lengths[side] + stream.n_layers * stream.n_heads * len(_attention_sublayers(stream))
        for stream, side in patched
    )
    runs = _Runs(model, corrupted, prefix_ids, n_runs, progress)
    with capture(model) as acts:
        clean_logits = runs.logits(source, prefix_ids)[0]
    corrupt_logits = runs.logits(corrupted, prefix_ids)[0]
    runs.target = one_token(out_tokenizer, target, what="--target") if target else int(clean_logits.argmax())
    runs.foil = one_token(out_tokenizer, foil, what="--foil") if foil else int(corrupt_logits.argmax())
    if runs.foil == runs.target and foil:
        raise QkvError("--foil is the same token as the target: give two different tokens")
    if runs.foil == runs.target:
        label = token_label(out_tokenizer, runs.target)
        raise QkvError(
            f"the foil is the target {label!r} itself (the corrupt prompt also leads to it): give --foil TOKEN, "
            "the answer the corrupt prompt should lead to"
        )
    clean_m = float(runs.difference(clean_logits[None])[0])
    corrupt_m = float(runs.difference(corrupt_logits[None])[0])
    gap = clean_m - corrupt_m
    if abs(gap) < 1e-6:
        raise QkvError(
            f"logit(target) - logit(foil) is {clean_m:.4f} on both prompts, so there is nothing to recover: "
            "choose a corrupt prompt that changes the answer"
        )

    def recovered(m: Tensor) -> np.ndarray:
        return ((m - corrupt_m) / gap).cpu().numpy()

    columns = {"source": clean_tokens, "target": token_labels(out_tokenizer, prefix_ids[0].tolist())
               if prefix_ids is not None else []}  # fmt: skip
    maps = []
    for stream, side in patched:
        maps += _stream_maps(runs, stream, acts, columns[side], recovered, named=len(patched) > 1)
    return Patching(
        kind=config.kind,
        clean_tokens=clean_tokens,
        corrupt_tokens=corrupt_tokens,
        target_id=runs.target,
        target_token=token_label(out_tokenizer, runs.target),
        foil_id=runs.foil,
        foil_token=token_label(out_tokenizer, runs.foil),
        clean_difference=clean_m,
        corrupt_difference=corrupt_m,
        maps=maps,
        prefix_tokens=columns["target"] if translator else None,
    )
