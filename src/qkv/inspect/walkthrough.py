"""The whole forward pass of a GPT on one text, step by step, with the model's own numbers (the walk-through).

The GPT notes' path from text to next token, read from one forward pass (:func:`~qkv.inspect.trace.trace`):

    tokens t_0 .. t_{T-1}                                 the tokenizer's pieces and their ids
    x_0[i] = W_E[t_i] (x sqrt(d_model) if scaled) + P[i]   token vector + position vector ("embedding.*")
    x_{l+1} = block_l(x_l)                               each block: masked attention, then the MLP
        A_{l,h} = softmax(Q K^T / sqrt(d_k) + mask)       (T, T) per head h: where each token looks
        |x_{l+1}[i]|                                      how large the residual stream has grown
        softmax(W_U final_norm(x_{l+1}[i]))               the logit lens: what block l would predict
    logits = W_U final_norm(x_N[T-1])                     the unembedding at the last position

Every number is read from the pass itself: the embedding vectors from ``embedding.tokens``/``.positions``,
the attention weights by :func:`~qkv.inspect.attention_maps.maps_from_trace`, the lens rows by
:func:`~qkv.inspect.lens.lens_from_trace`. The last step's probabilities under a temperature, top-k and
top-p are :func:`qkv.inspect.next_token`'s (the playground asks ``/v1/next-token``); the standalone page
(:mod:`~qkv.inspect.walkthrough_html`) carries the last position's logits so it can redo that one transform
offline.

The walk-through is for language models (decoder only: a GPT, a Llama): a translator's forward pass runs two
stacks over two texts and an encoder has no unembedding, so both get the family's refusal naming the command
that fits them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from qkv.errors import QkvError
from qkv.inspect.attention_maps import maps_from_trace
from qkv.inspect.lens import LogitLens, lens_from_trace
from qkv.inspect.names import act_name
from qkv.inspect.residual import output_stream
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import token_labels
from qkv.inspect.trace import trace
from qkv.model_dir import ModelBundle
from qkv.models.config import BaseConfig
from qkv.models.family import LANGUAGE_MODEL, family_of


@dataclass(repr=False)
class Walkthrough(ShortRepr):
    """One GPT forward pass, as the walk-through shows it (T tokens, d = d_model, L layers, H heads)."""

    tokens: list[str]  # (T,) labels
    ids: list[int]  # (T,)
    token_vectors: np.ndarray  # (T, d) W_E rows (scaled if the model scales them)
    position_vectors: np.ndarray | None  # (T, d) the positional encoding added; None for rope / no positions
    positional: str  # "learned", "sinusoidal", "rope" or "none"
    embedding: np.ndarray  # (T, d) x_0, their sum: the residual stream before block 0
    attention: np.ndarray  # (L, H, T, T) every block's and head's weights
    residual_norms: np.ndarray  # (L + 1, T) |x_l[i]|: row 0 after the embedding, row l + 1 after block l
    lens: LogitLens  # the logit lens of the same pass (rows: embedding, block 0, ..., block L-1)
    logits: np.ndarray  # (vocab,) the last position's logits: the model's own next-token scores
    vocab_labels: list[str] | None = None  # labels of every vocabulary entry (for the standalone page)
    kind: str = "gpt"  # the model's family: "gpt", "llama", ...

    @property
    def n_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attention.shape[1]

    def to_dict(self, digits: int = 4, *, logits: bool = False) -> dict:
        """JSON-ready, rounded to ``digits`` decimals; ``logits`` adds the last position's full logits and
        every vocabulary label (what a page needs to redo the sampling transform without a server)."""

        def r(a: np.ndarray) -> list:
            return np.round(np.asarray(a, dtype=np.float64), digits).tolist()

        lens = self.lens.to_dict(digits)
        data = {
            "kind": self.kind,
            "tokens": self.tokens,
            "ids": self.ids,
            "d_model": int(self.embedding.shape[1]),
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "positional": self.positional,
            "norm": self.lens.norm,
            "embedding": {
                "token": r(self.token_vectors),
                "position": None if self.position_vectors is None else r(self.position_vectors),
                "sum": r(self.embedding),
                "token_norms": r(np.linalg.norm(self.token_vectors, axis=-1)),
                "position_norms": None
                if self.position_vectors is None
                else r(np.linalg.norm(self.position_vectors, axis=-1)),
                "norms": r(self.residual_norms[0]),
                "lens": lens["top"][0],
            },
            "blocks": [
                {
                    "layer": layer,
                    "attention": r(self.attention[layer]),
                    "norms": r(self.residual_norms[layer + 1]),
                    "lens": lens["top"][layer + 1],
                }
                for layer in range(self.n_layers)
            ],
            "final": lens["final"],
        }
        if logits:
            data["logits"] = r(self.logits)
            data["vocab"] = self.vocab_labels
        return data

    def _repr_html_(self) -> str:
        """The page ``qkv lens --html`` writes, live temperature and all, inside a notebook's output."""
        from qkv.inspect.circuit_views import walkthrough_view

        return walkthrough_view(self)


@torch.no_grad()
def walkthrough(bundle: ModelBundle, text: str, *, top: int = 5, vocab: bool = False) -> Walkthrough:
    """Run ``bundle``'s GPT on ``text`` once and keep what each step of the forward pass computed.

    ``top`` tokens are kept per block and position for the logit lens; ``vocab`` also keeps every
    vocabulary entry's label (a standalone page needs them to name any token the sliders bring up).
    """
    family_of(bundle.model).require_role(LANGUAGE_MODEL, "the walk-through")  # one text, one stack, W_U
    if top < 1:
        raise QkvError(f"--top {top} must be at least 1")
    model, config = bundle.model, cast(BaseConfig, bundle.config)  # a language model's: the require_role above
    stream = output_stream(model, what="the walk-through")
    traced = trace(bundle, text)
    acts = traced.acts
    tokens = acts[stream.embedding_act("tokens")][0].double().cpu()  # (T, d)
    positions = acts.get(stream.embedding_act("positions"))  # (T, d) or absent (rope, none)
    positions = None if positions is None else positions.double().cpu().reshape(tokens.shape)
    embedding = acts[stream.resid(0)][0].double().cpu()  # (T, d) x_0
    norms = torch.stack([acts[stream.resid(row)][0].double().norm(dim=-1).cpu() for row in range(stream.n_layers + 1)])
    attention = maps_from_trace(traced).groups[stream.name].weights  # (L, H, T, T)
    labels = token_labels(bundle.tokenizer, range(bundle.tokenizer.vocab_size)) if vocab else None
    return Walkthrough(
        tokens=traced.source_tokens,
        ids=traced.source_ids,
        token_vectors=tokens.numpy(),
        position_vectors=None if positions is None else positions.numpy(),
        positional=config.positional,
        embedding=embedding.numpy(),
        attention=attention,
        residual_norms=norms.numpy(),  # (L + 1, T)
        lens=lens_from_trace(bundle, traced, top=top),
        logits=acts[act_name("logits")][0, -1].double().cpu().numpy(),  # (vocab,)
        vocab_labels=labels,
        kind=bundle.config.kind,
    )
