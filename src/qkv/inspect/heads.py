"""A head detector: which attention heads look at the previous token, the first token, or do induction.

Feed the model random tokens r_1 .. r_L repeated twice (random, so that only the repetition can be
predicted) and average, over the batch and the relevant query positions i, the attention weight A[i, j] a
head gives one key position j (Olsson et al. 2022, "In-context Learning and Induction Heads"):

- previous-token:  j = i - 1                  (every i >= 1)
- first-token:     j = 0, the attention sink  (every i >= 1; Xiao et al. 2023)
- induction:       j = i - L + 1              (i in the second copy: the token after the previous
                                               occurrence of the current token, "[A][B] ... [A] -> [B]")
- duplicate-token: j = i - L                  (i in the second copy: the previous occurrence itself)

Each score is an average of attention weights, so it lies in [0, 1]; a uniform head over T keys scores
about 1/T. An induction head needs a previous-token head in an earlier layer (K-composition), so a
one-layer model has none. Encoders read [CLS] first and [SEP] last, a translator's decoder <bos> first;
``bos=True`` puts the <bos> token in front of a GPT's sequences too (TransformerLens does so for GPT-2).
The weights are the model's own, captured from one batched forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from qkv.errors import QkvError
from qkv.inspect.names import act_name
from qkv.inspect.residual import device_of, run_model
from qkv.inspect.summary import ShortRepr
from qkv.inspect.trace import check_range, context_length, self_attention_title
from qkv.layers.capture import capture
from qkv.model_dir import ModelBundle
from qkv.models.family import ENCODER, LANGUAGE_MODEL, family_of
from qkv.tokenizers import Tokenizer

SCORES = ("previous-token", "first-token", "induction", "duplicate-token")


@dataclass(repr=False)
class HeadScores(ShortRepr):
    """Every score of every head of one kind of self-attention: (layers, heads) arrays in [0, 1]."""

    part: str  # "decoder" or "encoder"
    title: str
    scores: dict[str, np.ndarray]  # score name -> (L, H)
    first: str | None = None  # the token in front of every sequence ("<bos>", "[CLS]"), if any

    @property
    def n_layers(self) -> int:
        return next(iter(self.scores.values())).shape[0]

    @property
    def n_heads(self) -> int:
        return next(iter(self.scores.values())).shape[1]

    def top(self, score: str, n: int = 5) -> list[tuple[int, int, float]]:
        """The ``n`` highest-scoring heads for ``score`` as (layer, head, score), best first."""
        values = self.scores[score]
        order = np.argsort(-values, axis=None, kind="stable")[:n]
        return [(int(i // self.n_heads), int(i % self.n_heads), float(values.flat[i])) for i in order]


@dataclass(repr=False)
class HeadDetection(ShortRepr):
    """The head scores of every self-attention kind of a model, and the sequences they were measured on."""

    kind: str
    length: int  # L: each random sequence is L tokens, repeated twice
    batch: int
    seed: int
    parts: list[HeadScores]

    def part(self, name: str | None = None) -> HeadScores:
        if name is None:
            return self.parts[0]
        for part in self.parts:
            if part.part == name:
                return part
        raise QkvError(f"a {self.kind} model has no {name} self-attention: choose from {self.part_names()}")

    def part_names(self) -> str:
        return ", ".join(p.part for p in self.parts)

    def check(self, layer: int | None, head: int | None, part: str | None = None) -> None:
        """QkvError unless ``layer`` and ``head`` exist (None means all)."""
        scores = self.part(part)
        check_range(scores.title, scores.n_layers, scores.n_heads, layer, head)

    def to_dict(self, digits: int = 6, top: int = 5) -> dict:
        return {
            "kind": self.kind,
            "length": self.length,
            "batch": self.batch,
            "seed": self.seed,
            "parts": {
                p.part: {
                    "title": p.title,
                    "first": p.first,
                    "scores": {name: np.round(values, digits).tolist() for name, values in p.scores.items()},
                    "top": {
                        name: [
                            {"layer": layer, "head": head, "score": round(value, digits)}
                            for layer, head, value in p.top(name, top)
                        ]  # fmt: skip
                        for name in p.scores
                    },
                }
                for p in self.parts
            },
        }

    def _repr_png_(self) -> bytes:
        """The score maps ``qkv heads`` draws (:func:`~qkv.inspect.circuit_figures.draw_head_scores`)."""
        from qkv.inspect.circuit_views import heads_png

        return heads_png(self)

    def _repr_html_(self) -> str:
        """The score maps and the best head of every score (for notebooks)."""
        from qkv.inspect.circuit_views import heads_html

        return heads_html(self)


def score_weights(weights: Tensor, offset: int, length: int) -> dict[str, np.ndarray]:
    """The four scores of every head from attention weights (B, H, T, T) of sequences with ``offset`` tokens
    in front of two copies of ``length`` random tokens. -> name: (H,)"""
    w = weights.double()
    i = torch.arange(1, w.shape[-1], device=w.device)  # every query with a previous position
    second = torch.arange(offset + length, offset + 2 * length, device=w.device)  # queries in the second copy
    found = {
        "previous-token": w[..., i, i - 1],  # (B, H, n)
        "first-token": w[..., i, 0],
        "induction": w[..., second, second - length + 1],
        "duplicate-token": w[..., second, second - length],
    }
    return {name: values.mean(dim=(0, 2)).cpu().numpy() for name, values in found.items()}


def repeated_random_tokens(tokenizer: Tokenizer, vocab_size: int, length: int, batch: int,
                           generator: torch.Generator) -> Tensor:  # fmt: skip
    """(batch, 2 * length) ids: random non-special tokens, each row a sequence followed by itself.

    Tokens within a sequence are distinct when the vocabulary allows, so the induction target is unique.
    """
    special = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.unk_id} - {None}
    candidates = torch.tensor([i for i in range(vocab_size) if i not in special])
    if len(candidates) < 2:
        raise QkvError("the vocabulary has fewer than 2 ordinary tokens: there is nothing random to repeat")
    if length <= len(candidates):
        rows = [candidates[torch.randperm(len(candidates), generator=generator)[:length]] for _ in range(batch)]
    else:
        rows = [candidates[torch.randint(len(candidates), (length,), generator=generator)] for _ in range(batch)]
    first = torch.stack(rows)  # (batch, length)
    return torch.cat([first, first], dim=1)  # (batch, 2 * length)


def _with(ids: Tensor, before: int | None, after: int | None) -> Tensor:
    parts = [ids]
    if before is not None:
        parts.insert(0, torch.full((ids.shape[0], 1), before, dtype=ids.dtype))
    if after is not None:
        parts.append(torch.full((ids.shape[0], 1), after, dtype=ids.dtype))
    return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class _Side:
    """One self-attention kind to score: its blocks, and the token put in front of its sequences (if any)."""

    part: str
    title: str
    stack: str  # the module holding the blocks: "decoder" or "encoder"
    tokenizer: Tokenizer
    vocab_size: int
    before: int | None = None
    after: int | None = None


def _sides(bundle: ModelBundle, bos: bool) -> list[_Side]:
    """One side per stack with self-attention heads, with the tokens its sequences start (and end) with:
    [CLS] ... [SEP] for an encoder, <bos> for a translator's decoder, <bos> for a language model if ``bos``."""
    family = family_of(bundle.model)
    family.require("self-attention heads", "the head detector")
    config, source = bundle.config, bundle.tokenizer
    if bos and family.role == LANGUAGE_MODEL and source.bos_id is None:
        raise QkvError("--bos needs a <bos> token, and this tokenizer has none: leave --bos out")
    sides = []
    for part in family.self_attention_parts:
        target = family.side(part) == "target"
        tokenizer = (bundle.target_tokenizer or source) if target else source
        size = getattr(config, family.vocab_fields[-1 if target else 0])  # tgt_vocab_size / src_vocab_size
        before = after = None
        if family.role == ENCODER:
            before, after = tokenizer.bos_id, tokenizer.eos_id
        elif target:
            if tokenizer.bos_id is None:
                raise QkvError("the target tokenizer has no <bos> token: a translator needs one to start decoding")
            before = tokenizer.bos_id
        elif family.role == LANGUAGE_MODEL and bos:
            before = tokenizer.bos_id
        title = self_attention_title(family, part)
        sides.append(_Side(part, title, family.streams[part][1], tokenizer, min(size, tokenizer.vocab_size), before,
                           after))  # fmt: skip
    return sides


MAX_BATCH = 4096  # the scores are means over the batch: they settle with 8 to 64 sequences


def check_sizes(config, batch: int, length: int, seed: int, device: torch.device) -> None:
    """QkvError for a --batch below 1, above MAX_BATCH or whose captured activations would not fit in memory
    (estimated as training's, :func:`qkv.models.memory.activation_numbers`, for the ``length`` tokens of each
    sequence actually fed, not the model's whole context), and for a --seed torch refuses."""
    from qkv.models.memory import GIB, activation_numbers, available_memory

    if not 1 <= batch <= MAX_BATCH:
        raise QkvError(f"--batch {batch} must be between 1 and {MAX_BATCH:,}: the scores settle with 8 to 64")
    free = available_memory(device)
    need = 4 * activation_numbers(config, batch, length)
    if free is not None and need > free // 2:
        raise QkvError(
            f"--batch {batch:,} of {length:,} tokens needs about {need / GIB:.1f} GiB of activations, more than "
            f"half the {free / GIB:.1f} GiB available on {device}: lower --batch (8 to 64 suffice) or --length"
        )
    if not 0 <= seed < 2**63:
        raise QkvError(f"--seed {seed} must be between 0 and 2**63 - 1")


@torch.no_grad()
def detect_heads(
    bundle: ModelBundle, *, length: int | None = None, batch: int = 8, seed: int = 0, bos: bool = False
) -> HeadDetection:
    """Score every self-attention head of ``bundle``'s model for previous-token, first-token, induction and
    duplicate-token behaviour on ``batch`` random sequences of ``length`` tokens, each repeated twice
    (default length: 50, or less to fit the model's context)."""
    model, config = bundle.model, bundle.config
    model.eval()
    sides = _sides(bundle, bos)
    extra = max((s.before is not None) + (s.after is not None) for s in sides)
    longest = (context_length(config) - extra) // 2
    length = min(50, longest) if length is None else length
    if not 2 <= length <= longest:
        raise QkvError(
            f"--length {length} does not fit: two copies must fit the model's {context_length(config)} positions, "
            f"so use 2..{longest}"
        )
    check_sizes(config, batch, 2 * length + extra, seed, device_of(model))  # the tokens fed, not the context
    generator = torch.Generator().manual_seed(seed)
    device = device_of(model)
    inputs = [
        _with(repeated_random_tokens(s.tokenizer, s.vocab_size, length, batch, generator), s.before, s.after).to(device)
        for s in sides
    ]
    with capture(model) as acts:  # a GPT or an encoder reads one sequence, a translator a source and a target
        run_model(model, *inputs, last_only=True)  # the weights are all we need: W_U at one position, not 2L
    parts = []
    for side in sides:
        per_layer: list[dict[str, np.ndarray]] = []
        while act_name("weights", len(per_layer), stack=side.stack) in acts:
            weights = acts[act_name("weights", len(per_layer), stack=side.stack)]  # (B, H, T, T)
            per_layer.append(score_weights(weights, int(side.before is not None), length))
        scores = {score: np.stack([layer[score] for layer in per_layer]) for score in SCORES}  # (L, H) each
        first = side.tokenizer.id_to_token(side.before) if side.before is not None else None
        parts.append(HeadScores(side.part, side.title, scores, first))
    return HeadDetection(config.kind, length, batch, seed, parts)
