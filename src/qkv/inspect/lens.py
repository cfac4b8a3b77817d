"""The logit lens: what the model would predict if it stopped after each block (nostalgebraist, 2020).

The residual stream after block i, x_{i+1}, is read out exactly as the model reads its last block's output:

    lens_i = softmax(W_U final_norm(x_{i+1}) + b)        (rows: embedding, block 0, ..., block N-1)

so the last row is the model's own next-token distribution, and the earlier rows show the prediction
forming layer by layer. In a pre-LN model (GPT-2, qkv's GPTs) ``final_norm`` is the model's final
LayerNorm. A post-LN model (the paper's translators, Marian, BERT) ends every block with its own LayerNorm
and has no final one, so each block's output is already normalised the way W_U expects: the lens applies
W_U to it directly; only the embedding row is unnormalised there. Either way "read the stream as if the
remaining blocks were removed" holds exactly: the lens row of block i equals the logits of the model
truncated after block i.

Everything is read from one forward pass (:func:`~qkv.inspect.trace.trace`); the final norm and W_U are the
model's own modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from qkv.errors import QkvError
from qkv.inspect.names import act_name
from qkv.inspect.residual import final_norm, output_stream, read_out
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import token_label
from qkv.inspect.trace import Trace, trace
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of


@dataclass(repr=False)
class LogitLens(ShortRepr):
    """Every layer's top next tokens at every position, and how likely each layer finds the final answer."""

    kind: str  # the model's family: "gpt", "llama", "transformer", ...
    tokens: list[str]  # the positions: a GPT's text, a translator's decoder input (<bos> first)
    rows: list[str]  # "embedding", "block 0", ..., "block N-1": where the stream was read
    top_ids: np.ndarray  # (rows, T, k) the k likeliest next tokens at each row and position
    top_tokens: list[list[list[str]]]  # their labels
    top_probs: np.ndarray  # (rows, T, k)
    final_ids: list[int]  # (T,) the model's own prediction at each position (its top token)
    final_tokens: list[str]
    final_probs: np.ndarray  # (rows, T) the probability each row gives the final prediction
    final_ranks: np.ndarray  # (rows, T) its rank there (0 = top)
    norm: str  # what was applied before W_U: "final LayerNorm" or "none (...)"
    source_tokens: list[str] | None = None  # a translator's source sentence
    generated: bool = False  # a translator's target is its own greedy translation

    @property
    def n_rows(self) -> int:
        return len(self.rows)

    def to_dict(self, digits: int = 6) -> dict:
        """JSON-ready: per row and position the top tokens with probabilities, and the final token's
        probability and rank."""
        return {
            "kind": self.kind,
            "tokens": self.tokens,
            "source_tokens": self.source_tokens,
            "generated": self.generated,
            "norm": self.norm,
            "rows": self.rows,
            "final": [{"id": int(i), "token": tok} for i, tok in zip(self.final_ids, self.final_tokens, strict=True)],
            "final_probabilities": np.round(self.final_probs, digits).tolist(),
            "final_ranks": self.final_ranks.tolist(),
            "top": [
                [
                    [
                        {"id": int(i), "token": tok, "probability": round(float(p), digits)}
                        for i, tok, p in zip(ids, toks, probs, strict=True)
                    ]
                    for ids, toks, probs in zip(self.top_ids[r], self.top_tokens[r], self.top_probs[r], strict=True)
                ]
                for r in range(self.n_rows)
            ],
        }

    def _repr_png_(self) -> bytes:
        """The heatmap ``qkv lens`` draws (:func:`~qkv.inspect.circuit_figures.draw_logit_lens`)."""
        from qkv.inspect.circuit_views import lens_png

        return lens_png(self)

    def _repr_html_(self) -> str:
        """The heatmap and, at the last position, every layer's top token (for notebooks)."""
        from qkv.inspect.circuit_views import lens_html

        return lens_html(self)


def norm_description(model: nn.Module) -> str:
    norm = final_norm(model)
    if not isinstance(norm, nn.Identity):
        return f"final {type(norm).__name__}"  # "final LayerNorm", "final RMSNorm"
    if model.config.norm_first:  # type: ignore[union-attr]
        return "none (the model has no final norm)"
    return "none (post-LN: every block ends in its own LayerNorm)"


@torch.no_grad()
def logit_lens(bundle: ModelBundle, text: str, *, target: str | None = None, top: int = 5) -> LogitLens:
    """Read ``bundle``'s residual stream after the embedding and after every block through the final norm
    and W_U, on ``text`` (a translator's source sentence; its decoder reads ``target``, or its own greedy
    translation when None). ``top`` tokens are kept per row and position."""
    if top < 1:
        raise QkvError(f"--top {top} must be at least 1")
    output_stream(bundle.model, what="the logit lens")  # an encoder has no W_U: say so before running it
    return lens_from_trace(bundle, trace(bundle, text, target=target), top=top)


@torch.no_grad()
def lens_from_trace(bundle: ModelBundle, traced: Trace, *, top: int = 5) -> LogitLens:
    """:func:`logit_lens` of a forward pass already traced (the walk-through reads it from the same pass)."""
    if top < 1:
        raise QkvError(f"--top {top} must be at least 1")
    model = bundle.model
    stream = output_stream(model, what="the logit lens")
    family = family_of(model)
    tokens = traced.tokens(family.side(stream.name))  # a translator's decoder reads the target
    tokenizer = (bundle.target_tokenizer or bundle.tokenizer) if family.two_vocabularies else bundle.tokenizer
    final_logits = traced.acts[act_name("logits")][0].float()  # (T, vocab): the model's own
    final_ids = final_logits.argmax(-1)  # (T,)
    top = min(top, final_logits.shape[-1])
    top_ids, top_probs, final_probs, final_ranks = [], [], [], []
    for row in range(stream.n_layers + 1):  # one row at a time: (T, vocab) never (rows, T, vocab)
        logits = read_out(model, traced.acts[stream.resid(row)][0]).float()  # (T, vocab)
        probs = torch.softmax(logits, dim=-1)
        values, ids = probs.topk(top, dim=-1)  # (T, k)
        top_ids.append(ids.cpu())
        top_probs.append(values.double().cpu())
        chosen = logits.gather(-1, final_ids[:, None])  # (T, 1)
        final_probs.append(probs.gather(-1, final_ids[:, None])[:, 0].double().cpu())
        final_ranks.append((logits > chosen).sum(-1).cpu())
    ids_array = torch.stack(top_ids).numpy()  # (rows, T, k)
    return LogitLens(
        kind=traced.kind,
        tokens=tokens,
        rows=stream.rows,
        top_ids=ids_array,
        top_tokens=[[[token_label(tokenizer, int(i)) for i in pos] for pos in row] for row in ids_array],
        top_probs=torch.stack(top_probs).numpy(),
        final_ids=final_ids.tolist(),
        final_tokens=[token_label(tokenizer, int(i)) for i in final_ids],
        final_probs=torch.stack(final_probs).numpy(),
        final_ranks=torch.stack(final_ranks).numpy(),
        norm=norm_description(model),
        source_tokens=traced.source_tokens if family.two_vocabularies else None,
        generated=traced.generated,
    )
