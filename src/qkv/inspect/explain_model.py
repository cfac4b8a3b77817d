"""One head of a real model explained: the numbers of :mod:`qkv.inspect.explain` read from a forward pass.

The token embeddings, positional encodings and the chosen layer's Q, K, V come from the model's own
forward pass (:func:`~qkv.inspect.trace.trace`, i.e. :func:`qkv.layers.capture.capture`); steps 4-8 are
recomputed from them with qkv's attention functions and checked against the weights the model computed
itself; step 9 concatenates every head of the layer and applies the layer's own W_o.
"""

from __future__ import annotations

from typing import cast

import numpy as np
from torch import nn

from qkv.errors import QkvError
from qkv.inspect.explain import Explanation, explain_attention
from qkv.inspect.names import act_name
from qkv.inspect.trace import Part, Trace, check_layer_head, trace
from qkv.model_dir import ModelBundle
from qkv.models.family import Family, family_of


def _embedding_of(family: Family, tokens: str) -> str:
    """The module that embeds the ``tokens`` stream ("source" or "target"): "embedding", "tgt_embedding", ..."""
    return next(embedding for part, (embedding, _) in family.streams.items() if family.side(part) == tokens)


def explain_model(
    bundle: ModelBundle,
    text: str,
    *,
    layer: int = 0,
    head: int = 0,
    part: str | None = None,
    causal: bool | None = None,
    query: str | int | None = None,
    target: str | None = None,
) -> Explanation:
    """One head of a real model on ``text``: embeddings, positions, Q, K, V and the weights, all from the
    model's own forward pass (:func:`~qkv.inspect.trace.trace`), then every step recomputed from its Q, K, V
    and compared with the weights the model computed itself (``model_difference``).

    ``part`` picks "encoder", "decoder" or "cross" attention (default: the model's first); ``causal``
    overrides the model's mask (the weights then differ from the model's, and a note says so). The
    multi-head step uses all heads' Q, K, V of the layer and the layer's own W_o (``out_proj``).
    """
    family = family_of(bundle.model)
    family.require("self-attention heads", "explaining a head step by step")  # Q, K and V per head
    if target is not None and not family.two_vocabularies:
        raise QkvError("--target is for translators: a GPT or an encoder reads one text")
    traced = trace(bundle, text, target=target)
    spec = traced.part(part)
    check_layer_head(spec, layer, head)
    if causal and spec.name == "cross":
        raise QkvError("cross-attention has no causal mask (each target token sees the whole source): drop --causal")
    use_causal = spec.causal if causal is None else causal
    q, k, v = (traced.attention(spec, layer, name).cpu() for name in ("q", "k", "v"))  # (h, T, d_k)
    module = traced.model.get_submodule(spec.module_name(layer))
    out_proj = cast(nn.Linear, module.out_proj)
    w_o = out_proj.weight.detach().cpu().T  # nn.Linear computes x W^T: W_o = weight^T (h*d_k, d_model)
    b_o = out_proj.bias.detach().cpu() if out_proj.bias is not None else None
    window = getattr(module, "window", None) if use_causal and spec.causal else None  # the model's sliding window
    where = f"layer {layer}, head {head} of {spec.n_heads}"
    explanation = explain_attention(
        traced.tokens(spec.queries),
        q,
        k,
        v,
        key_tokens=traced.tokens(spec.keys),
        head=head,
        causal=use_causal,
        query=query,
        out_proj=(w_o, b_o),
        title=f"{spec.title}, {where} ({bundle.path})",
        variant="model",
        window=window,
    )
    explanation.layer, explanation.part = layer, spec.name
    _add_model_inputs(explanation, traced, _embedding_of(family, spec.queries))
    own = traced.attention(spec, layer, "weights")[head].double().cpu().numpy()
    explanation.model_difference = float(np.abs(own - explanation.weights).max())
    _add_notes(explanation, bundle, traced, spec, layer=layer, head=head, causal=use_causal, window=window)
    return explanation


def _add_model_inputs(explanation: Explanation, traced: Trace, embedding: str) -> None:
    """Step 2 from the model's own forward pass: W_E rows, the positions added (if any), and X."""
    acts = traced.acts
    explanation.embeddings = acts[act_name("tokens", embedding=embedding)][0].double().cpu().numpy()
    if act_name("positions", embedding=embedding) in acts:
        explanation.positions = acts[act_name("positions", embedding=embedding)].double().cpu().numpy()
    explanation.inputs = acts[act_name("embed", embedding=embedding)][0].double().cpu().numpy()


def _add_notes(explanation: Explanation, bundle: ModelBundle, traced: Trace, spec: Part, *, layer: int,
               head: int, causal: bool, window: int | None) -> None:  # fmt: skip
    """The notes on where the numbers come from: a generated target, an overridden mask, a sliding window,
    RoPE, and what Q, K and V multiply in this kind of attention."""
    notes = explanation.notes
    if traced.generated:
        notes.append("The target is the model's own greedy translation, fed back teacher-forced after <bos>.")
    if causal != spec.causal:
        notes.append(
            f"The model {'uses' if spec.causal else 'does not use'} a causal mask here; these weights are "
            "recomputed with your choice and are not the model's own."
        )
    if window is not None and len(explanation.key_tokens) > window:
        notes.append(f"The model slides a window of {window} positions: each token sees the last {window} only.")
    family = family_of(bundle.model)
    if family.positions(bundle.config) == "rope":
        notes.append("Positions enter through RoPE: Q and K are rotated by their position's angle (no PE is added).")
    input_norm = family.block_input_norm(bundle.config)
    source = "the embeddings" if layer == 0 else f"the output of block {layer - 1}"
    note = family.embedding_note(bundle.config) if family.embedding_note is not None else None
    if layer == 0 and note is not None:
        source = note
    d_k = explanation.d_k
    columns = f"columns {head * d_k}..{(head + 1) * d_k - 1} for head {head}"
    if spec.name == "cross":
        notes.append(
            "Cross-attention: Q = the decoder's vectors after this block's masked self-attention times W_q; "
            f"K, V = the encoder output (memory) times W_k, W_v; {columns}."
        )
    else:
        after = f" after {input_norm}" if input_norm else ""
        notes.append(f"Q, K, V = {source}{after} times this layer's W_q, W_k, W_v (+ bias), {columns}.")
