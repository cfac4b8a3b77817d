"""Direct logit attribution: how much the embedding, each layer's attention and MLP, and each head write
the logit of one token into the residual stream (Elhage et al. 2021; TransformerLens's convention).

In a pre-LN model the final stream at a position is a plain sum, x = e + sum_i (attn_i + mlp_i) (+ cross_i
in a translator's decoder), and each attention output is itself a sum over heads, attn_i = sum_h head_ih +
b_O, with head_ih = z_ih W_O[:, h] (z = the head's output before W_O mixes the heads). The logit of token
t is

    logit_t = W_U[t] . (gamma * (x - mean(x)) / sigma + beta) + b_U[t],   sigma = sqrt(var(x) + eps)

LayerNorm is linear in x once sigma is fixed, and mean-centring is linear too, so with sigma computed on
the full stream (the linearisation TransformerLens uses) the logit splits exactly into one term per part:

    contribution(c) = W_U[t] . (gamma * (c - mean(c))) / sigma        for every part c of x
    logit_t = sum of contributions + W_U[t] . beta + b_U[t]           (the "bias" term)

A positive contribution pushes t up, a negative one pushes it down. With ``foil`` the direction is
W_U[t] - W_U[foil], so the parts sum to the logit difference. A post-LN model renormalises the stream in
every block, so its parts do not add up to the logits; this analysis is for pre-LN models (GPTs, GPT-2,
pre-LN translators). All parts are read from one captured forward pass; heads go through the model's own
W_O (``out_proj``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np
import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.inspect.answer import one_token
from qkv.inspect.names import act_name
from qkv.inspect.residual import Stream, final_norm, output_stream
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import find_position, token_label
from qkv.inspect.trace import trace
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of


@dataclass(repr=False)
class Attribution(ShortRepr):
    """Each part's push on logit(target) [- logit(foil)] at one position; the parts sum to the logit."""

    kind: str
    tokens: list[str]  # the positions (a translator: its decoder input, <bos> first)
    position: int
    target_id: int
    target_token: str
    foil_id: int | None
    foil_token: str | None
    logit: float  # the model's own logit(target) [- logit(foil)] at ``position``
    embedding: dict[str, float]  # {"tokens": W_E part, "positions": positional part (if added)}
    attention: np.ndarray  # (L,) each block's self-attention output
    mlp: np.ndarray  # (L,) each block's feed-forward output
    heads: np.ndarray  # (L, H) each self-attention head (they sum to ``attention`` minus ``attention_bias``)
    attention_bias: np.ndarray  # (L,) each block's W_O bias b_O
    bias: float  # W_U[t] . beta + b_U[t]: what the final norm's bias and the unembedding's bias add
    scale: float  # sigma, the final norm's scale at this position (1 when the model has no final norm)
    cross: np.ndarray | None = None  # (L,) a translator's cross-attention outputs
    cross_heads: np.ndarray | None = None  # (L, H)
    cross_bias: np.ndarray | None = None  # (L,)

    @property
    def n_layers(self) -> int:
        return len(self.attention)

    def total(self) -> float:
        """The sum of every part: equal to ``logit`` up to rounding (the decomposition is exact)."""
        parts = sum(self.embedding.values()) + self.attention.sum() + self.mlp.sum() + self.bias
        return float(parts + (self.cross.sum() if self.cross is not None else 0.0))

    def terms(self) -> list[tuple[str, float]]:
        """(label, contribution) for the embedding parts, every block's sublayers, and the bias."""
        rows = [(f"embedding ({name})", value) for name, value in self.embedding.items()]
        for i in range(self.n_layers):
            rows.append((f"block {i} attention", float(self.attention[i])))
            if self.cross is not None:
                rows.append((f"block {i} cross-attention", float(self.cross[i])))
            rows.append((f"block {i} MLP", float(self.mlp[i])))
        rows.append(("bias (final norm, W_U)", self.bias))
        return rows

    def top_heads(self, n: int, *, cross: bool = False) -> list[tuple[int, int, float]]:
        """The ``n`` heads with the largest |contribution|, as (layer, head, contribution)."""
        heads = self.cross_heads if cross else self.heads
        if heads is None:
            return []
        order = np.argsort(-np.abs(heads), axis=None, kind="stable")[:n]
        return [(int(i // heads.shape[1]), int(i % heads.shape[1]), float(heads.flat[i])) for i in order]

    def to_dict(self, digits: int = 6) -> dict:
        def r(a: np.ndarray | None) -> list | None:
            return None if a is None else np.round(a, digits).tolist()

        return {
            "kind": self.kind,
            "tokens": self.tokens,
            "position": self.position,
            "target": {"id": self.target_id, "token": self.target_token},
            "foil": None if self.foil_id is None else {"id": self.foil_id, "token": self.foil_token},
            "logit": round(self.logit, digits),
            "total": round(self.total(), digits),
            "scale": round(self.scale, digits),
            "bias": round(self.bias, digits),
            "embedding": {k: round(v, digits) for k, v in self.embedding.items()},
            "attention": r(self.attention),
            "mlp": r(self.mlp),
            "heads": r(self.heads),
            "attention_bias": r(self.attention_bias),
            "cross": r(self.cross),
            "cross_heads": r(self.cross_heads),
            "cross_bias": r(self.cross_bias),
            "terms": [{"label": label, "value": round(value, digits)} for label, value in self.terms()],
        }

    def _repr_png_(self) -> bytes:
        """The picture ``qkv attribute`` draws (:func:`~qkv.inspect.circuit_figures.draw_attribution`)."""
        from qkv.inspect.circuit_views import attribution_png

        return attribution_png(self)

    def _repr_html_(self) -> str:
        """The picture and every part's contribution (for notebooks)."""
        from qkv.inspect.circuit_views import attribution_html

        return attribution_html(self)


def head_outputs(attention: nn.Module, context: Tensor) -> tuple[Tensor, Tensor]:
    """What each head writes into the stream, z_h W_O[:, h] (H, ..., d), and W_O's bias b_O (d,).

    ``context`` is (H, ..., d_k), each head's output before W_O; the model's own ``out_proj`` maps each
    head alone (the others zeroed), so the heads plus b_O sum to the attention output.
    """
    n_heads, d_k = context.shape[0], context.shape[-1]
    alone = context.new_zeros(n_heads, *context.shape[1:-1], n_heads * d_k)  # (H, ..., d_model)
    for h in range(n_heads):
        alone[h, ..., h * d_k : (h + 1) * d_k] = context[h]
    out_proj = cast(nn.Module, attention.out_proj)
    bias = out_proj(context.new_zeros(1, n_heads * d_k))[0]  # (d_model,)
    return out_proj(alone) - bias, bias


class _Readout:
    """The linearised final norm and W_U: contribution(c) = u . (gamma * (c - mean c)) / sigma; RMSNorm
    (Llama) subtracts no mean, so there contribution(c) = u . (gamma * c) / rms(x)."""

    def __init__(self, model: nn.Module, final_stream: Tensor, target: int, foil: int | None) -> None:
        unembedding = cast(nn.Linear, model.unembedding)
        weight = unembedding.weight.detach().double()
        self.direction = weight[target] - (weight[foil] if foil is not None else 0.0)  # (d,)
        u_bias = 0.0
        if unembedding.bias is not None:
            b = unembedding.bias.detach().double()
            u_bias = float(b[target] - (b[foil] if foil is not None else 0.0))
        norm = final_norm(model)
        self.centre = isinstance(norm, nn.LayerNorm)  # LayerNorm subtracts the mean; RMSNorm does not
        self.layer_norm = self.centre or isinstance(norm, nn.RMSNorm)  # qkv's RMSNorm is an nn.RMSNorm
        if self.layer_norm:
            x = final_stream.double()
            x = x - x.mean() if self.centre else x
            eps = getattr(norm, "eps", None) or torch.finfo(final_stream.dtype).eps  # nn.RMSNorm: eps None
            self.scale = float(torch.sqrt(x.pow(2).mean() + eps))
            gain = getattr(norm, "weight", None)
            self.gain = gain.detach().double() if gain is not None else torch.ones_like(x)
            bias = getattr(norm, "bias", None)
            beta = float(self.direction @ bias.detach().double()) if bias is not None else 0.0
            self.bias = beta + u_bias
        elif isinstance(norm, nn.Identity):
            self.scale, self.gain, self.bias = 1.0, None, u_bias
        else:
            raise QkvError(
                f"direct logit attribution cannot split a final {type(norm).__name__} into parts (it knows LayerNorm "
                "and RMSNorm): use `qkv lens` or `qkv patch` with this model"
            )

    def __call__(self, parts: Tensor) -> np.ndarray:
        """Contributions of ``parts`` (..., d) -> (...)."""
        parts = parts.double()
        if self.layer_norm:
            parts = parts - parts.mean(-1, keepdim=True) if self.centre else parts
            parts = parts * self.gain / self.scale
        return (parts @ self.direction).cpu().numpy()


@torch.no_grad()
def attribute(
    bundle: ModelBundle,
    text: str,
    *,
    target: str | None = None,
    foil: str | None = None,
    position: str | int = -1,
    prefix: str = "",
) -> Attribution:
    """Direct logit attribution of ``target`` (default: the model's top prediction) at ``position`` (an
    index or a token; default the last) on ``text``; with ``foil``, of logit(target) - logit(foil).

    A translator reads ``text`` as its source and ``prefix`` as the target written so far (after <bos>).
    """
    model = bundle.model
    stream = output_stream(model, what="direct logit attribution")
    if not stream.norm_first:
        raise QkvError(
            "direct logit attribution needs a pre-LN model: this post-LN one (the paper, BERT, Marian) "
            "renormalises the stream in every block, so its parts do not add up to the logits; use `qkv lens` "
            "or `qkv patch` with it"
        )
    translator = family_of(model).two_vocabularies  # its decoder reads a target prefix beside the source
    if prefix and not translator:
        raise QkvError("--prefix is for translators: a GPT continues the text itself")
    traced = trace(bundle, text, target=prefix if translator else None)
    tokenizer = (bundle.target_tokenizer or bundle.tokenizer) if translator else bundle.tokenizer
    tokens = traced.target_tokens if translator else traced.source_tokens
    assert tokens is not None
    p = find_position(tokens, position, what="--position")
    acts = traced.acts
    logits = acts[act_name("logits")][0, p].double()
    target_id = one_token(tokenizer, target, what="--target") if target is not None else int(logits.argmax())
    foil_id = one_token(tokenizer, foil, what="--foil") if foil is not None else None
    if foil_id == target_id:
        raise QkvError("--foil is the same token as --target: give two different tokens")
    readout = _Readout(model, acts[stream.resid(stream.n_layers)][0, p], target_id, foil_id)
    embedding = {"tokens": float(readout(acts[stream.embedding_act("tokens")][0, p]))}
    if stream.embedding_act("positions") in acts:  # absent with rotary or no positions
        embedding["positions"] = float(readout(acts[stream.embedding_act("positions")][p]))
    parts = _sublayer_parts(model, stream, acts, p, readout)
    logit = float(logits[target_id] - (logits[foil_id] if foil_id is not None else 0.0))
    return Attribution(
        kind=traced.kind,
        tokens=tokens,
        position=p,
        target_id=target_id,
        target_token=token_label(tokenizer, target_id),
        foil_id=foil_id,
        foil_token=token_label(tokenizer, foil_id) if foil_id is not None else None,
        logit=logit,
        embedding=embedding,
        bias=readout.bias,
        scale=readout.scale,
        **parts,
    )


def _sublayer_parts(model: nn.Module, stream: Stream, acts: dict[str, Tensor], p: int, readout: _Readout) -> dict:
    """Per-layer contributions of every sublayer, and per-head ones of every attention sublayer."""
    names = {"attn": ("attention", "heads", "attention_bias"), "cross": ("cross", "cross_heads", "cross_bias")}
    found: dict[str, list] = {}
    for i in range(stream.n_layers):
        for sub in stream.sublayers:
            total = float(readout(acts[stream.sublayer_out(i, sub)][0, p]))
            if sub.attention is None:
                found.setdefault("mlp", []).append(total)
                continue
            layer_name, heads_name, bias_name = names[sub.kind]
            attention = model.get_submodule(f"{stream.block(i)}.{sub.attention}")
            context = acts[stream.attention_act(i, sub, "context")][0, :, p]  # (H, d_k)
            heads, bias = head_outputs(attention, context)  # (H, d), (d,)
            found.setdefault(layer_name, []).append(total)
            found.setdefault(heads_name, []).append(readout(heads))
            found.setdefault(bias_name, []).append(float(readout(bias)))
    return {name: np.array(values, dtype=np.float64) for name, values in found.items()}
