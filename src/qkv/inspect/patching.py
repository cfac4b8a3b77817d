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
from qkv.inspect.patch_runs import PatchRuns, Progress, head_patches, position_patches
from qkv.inspect.residual import Stream, Sublayer, device_of, streams
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import token_label, token_labels
from qkv.inspect.trace import context_length, encode_text
from qkv.layers.capture import capture
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
from qkv.tokenizers import Tokenizer


@dataclass(repr=False)
class PatchMap(ShortRepr):
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


@dataclass(repr=False)
class Patching(ShortRepr):
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


def _attention_sublayers(stream: Stream) -> list[Sublayer]:
    return [sub for sub in stream.sublayers if sub.attention is not None]


def _stream_maps(
    runs: PatchRuns,
    stream: Stream,
    acts: dict[str, Tensor],
    columns: list[str],
    recovered: Callable[[Tensor], np.ndarray],
    *,
    named: bool,
) -> list[PatchMap]:
    """The residual map (rows x positions) and one heads map (layers x heads) per kind of attention."""
    prefix = f"{stream.name} " if named else ""  # a translator has an encoder and a decoder stream
    rows, bad = range(stream.n_layers + 1), runs.corrupt
    patches = [p for r in rows for p in position_patches(stream, r, acts[stream.resid(r)], bad[stream.resid(r)],
                                                          runs.budget)]  # fmt: skip
    length = acts[stream.resid(0)].shape[1]
    resid = recovered(runs.run(stream, patches, len(rows) * length, runs.unchanged)).reshape(len(rows), length)
    title = f"{prefix}residual stream".capitalize()
    maps = [PatchMap(f"{prefix}residual", title, stream.rows, columns, "position", resid)]
    for sub in _attention_sublayers(stream):
        name = "cross heads" if sub.kind == "cross" else f"{prefix}heads"
        title = "Cross-attention heads" if sub.kind == "cross" else f"{prefix}self-attention heads".capitalize()
        sites = [stream.attention_act(i, sub, "context") for i in range(stream.n_layers)]
        patches = [p for i, site in enumerate(sites) for p in head_patches(i, site, acts[site], bad[site])]
        size = stream.n_layers * stream.n_heads
        values = recovered(runs.run(stream, patches, size, runs.unchanged)).reshape(stream.n_layers, -1)
        layers = [f"block {i}" for i in range(stream.n_layers)]
        heads = [str(h) for h in range(stream.n_heads)]
        maps.append(PatchMap(name, title, layers, heads, "head", values))
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
    clean_ids, corrupt_ids = _prompt_pair(tokenizer, clean, corrupt, context_length(config))
    device = device_of(model)
    prefix_ids = _decoder_prefix(out_tokenizer, prefix, context_length(config), device) if translator else None
    source = torch.tensor([clean_ids], device=device)
    corrupted = torch.tensor([corrupt_ids], device=device)
    lengths = {"source": len(clean_ids), "target": prefix_ids.shape[1] if prefix_ids is not None else 0}
    first = 0 if translator else next(i for i, (a, b) in enumerate(zip(clean_ids, corrupt_ids, strict=True)) if a != b)
    runs = PatchRuns(model, corrupted, prefix_ids, _run_count(patched, lengths), progress, first=first)
    with capture(model) as acts:
        clean_logits = runs.logits(source, prefix_ids)[0]
    with capture(model) as runs.corrupt:
        corrupt_logits = runs.logits(corrupted, prefix_ids)[0]
    _choose_answers(runs, out_tokenizer, target, foil, clean_logits, corrupt_logits)
    clean_m, corrupt_m = _differences(runs, clean_logits, corrupt_logits)

    def recovered(m: Tensor) -> np.ndarray:
        return ((m - corrupt_m) / (clean_m - corrupt_m)).cpu().numpy()

    clean_tokens = token_labels(tokenizer, clean_ids)
    columns = {"source": clean_tokens, "target": token_labels(out_tokenizer, prefix_ids[0].tolist())
               if prefix_ids is not None else []}  # fmt: skip
    maps = [m for stream, side in patched for m in _stream_maps(runs, stream, acts, columns[side], recovered,
                                                                named=len(patched) > 1)]  # fmt: skip
    return Patching(
        kind=config.kind,
        clean_tokens=clean_tokens,
        corrupt_tokens=token_labels(tokenizer, corrupt_ids),
        target_id=runs.target,
        target_token=token_label(out_tokenizer, runs.target),
        foil_id=runs.foil,
        foil_token=token_label(out_tokenizer, runs.foil),
        clean_difference=clean_m,
        corrupt_difference=corrupt_m,
        maps=maps,
        prefix_tokens=columns["target"] if translator else None,
    )


def _prompt_pair(tokenizer: Tokenizer, clean: str, corrupt: str, limit: int) -> tuple[list[int], list[int]]:
    """The two prompts' ids: as many tokens each (patching swaps position by position), and not the same."""
    clean_ids = encode_text(tokenizer, clean, limit=limit, what="clean prompt")
    corrupt_ids = encode_text(tokenizer, corrupt, limit=limit, what="corrupt prompt")
    if len(clean_ids) != len(corrupt_ids):
        clean_tokens, corrupt_tokens = token_labels(tokenizer, clean_ids), token_labels(tokenizer, corrupt_ids)
        raise QkvError(
            f"the clean prompt is {len(clean_ids)} tokens and the corrupt one {len(corrupt_ids)}: patching swaps "
            "activations position by position, so reword one of them to the same token length "
            f"(clean: {' '.join(clean_tokens)} | corrupt: {' '.join(corrupt_tokens)})"
        )
    if clean_ids == corrupt_ids:
        raise QkvError("the clean and corrupt prompts are the same tokens: change the corrupt one where it matters")
    return clean_ids, corrupt_ids


def _decoder_prefix(tokenizer: Tokenizer, prefix: str, limit: int, device: torch.device) -> Tensor:
    """A translator's decoder input (1, T): <bos> and the target written so far, within the context."""
    if tokenizer.bos_id is None:
        raise QkvError("the target tokenizer has no <bos> token: a translator needs one to start decoding")
    decoder_input = [tokenizer.bos_id, *tokenizer.encode(prefix)]
    if len(decoder_input) > limit:
        raise QkvError(f"--prefix is longer than the model's {limit} positions: shorten it")
    return torch.tensor([decoder_input], device=device)


def _run_count(patched: list[tuple[Stream, str]], lengths: dict[str, int]) -> int:
    """Patched runs in all: every residual site (L + 1 rows x the side's positions) and every head's output."""
    return sum(
        (stream.n_layers + 1) * lengths[side] + stream.n_layers * stream.n_heads * len(_attention_sublayers(stream))
        for stream, side in patched
    )


def _choose_answers(runs: PatchRuns, tokenizer: Tokenizer, target: str | None, foil: str | None,
                    clean_logits: Tensor, corrupt_logits: Tensor) -> None:  # fmt: skip
    """Set ``runs``' target (given, or the clean run's top token) and foil (given, or the corrupt run's top)."""
    runs.target = one_token(tokenizer, target, what="--target") if target else int(clean_logits.argmax())
    runs.foil = one_token(tokenizer, foil, what="--foil") if foil else int(corrupt_logits.argmax())
    if runs.foil == runs.target and foil:
        raise QkvError("--foil is the same token as the target: give two different tokens")
    if runs.foil == runs.target:
        label = token_label(tokenizer, runs.target)
        raise QkvError(
            f"the foil is the target {label!r} itself (the corrupt prompt also leads to it): give --foil TOKEN, "
            "the answer the corrupt prompt should lead to"
        )


def _differences(runs: PatchRuns, clean_logits: Tensor, corrupt_logits: Tensor) -> tuple[float, float]:
    """m = logit(target) - logit(foil) on the clean and the corrupt run; they must differ to recover anything."""
    clean_m = float(runs.difference(clean_logits[None])[0])
    corrupt_m = float(runs.difference(corrupt_logits[None])[0])
    runs.unchanged = corrupt_m
    if abs(clean_m - corrupt_m) < 1e-6:
        raise QkvError(
            f"logit(target) - logit(foil) is {clean_m:.4f} on both prompts, so there is nothing to recover: "
            "choose a corrupt prompt that changes the answer"
        )
    return clean_m, corrupt_m
