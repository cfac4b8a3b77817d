"""Every activation's name, made by one function (TransformerLens's ``get_act_name``).

:func:`qkv.layers.capture.record` stores each tensor under its module's dotted name plus a short name, so
the names follow the model's module tree. The views never spell them out; they ask :func:`act_name`:

    act_name("tokens", embedding="embedding")          embedding.tokens      (B, T, d) W_E rows
    act_name("positions", embedding="embedding")       embedding.positions   (T, d) the position vectors added
    act_name("embed", embedding="embedding")           embedding.output      (B, T, d) x_0, the stream's start
    act_name("q", 0)                                   decoder.blocks.0.self_attn.q        (B, h, T, d_k)
    act_name("weights", 1, attention="cross_attn")     decoder.blocks.1.cross_attn.weights (B, h, Tq, Tk)
    act_name("weights", attention="attention")         decoder.attention.weights (RNNSearch: no blocks)
    act_name("sublayer_out", 0, sublayer="ffn_sublayer")  decoder.blocks.0.ffn_sublayer.out  (B, T, d)
    act_name("resid_post", 0, stack="encoder")         encoder.blocks.0.output  (B, T, d) after block 0
    act_name("resid_pre", 0)                           embedding.output: the stream before block 0
    act_name("logits")                                 logits               (B, T, vocab)

``stack`` is the module holding the blocks ("decoder", "encoder"), ``embedding`` the module that embeds
that stack's input ("embedding", "src_embedding", "tgt_embedding"): a family's ``streams`` give both.
"""

from __future__ import annotations

EMBEDDING = {"tokens": "tokens", "positions": "positions", "embed": "output"}
ATTENTION = ("q", "k", "v", "weights", "context")  # what every attention module records
MODEL = ("logits", "memory", "hidden")  # recorded by the model itself: no module prefix


def block_name(layer: int, stack: str = "decoder") -> str:
    """The module of block ``layer`` of ``stack``: "decoder.blocks.0"."""
    return f"{stack}.blocks.{layer}"


def attention_name(layer: int | None, stack: str = "decoder", attention: str = "self_attn") -> str:
    """The attention module ``attention`` of block ``layer``; with ``layer`` None, one directly in ``stack``
    (RNNSearch's "decoder.attention")."""
    return f"{stack}.{attention}" if layer is None else f"{block_name(layer, stack)}.{attention}"


def act_name(
    what: str,
    layer: int | None = None,
    *,
    stack: str = "decoder",
    embedding: str = "embedding",
    attention: str = "self_attn",
    sublayer: str | None = None,
) -> str:
    """The name :func:`~qkv.layers.capture.capture` records ``what`` under (see the module's table)."""
    if what in EMBEDDING:
        return f"{embedding}.{EMBEDDING[what]}"
    if what in MODEL:
        return what
    if what in ATTENTION:
        return f"{attention_name(layer, stack, attention)}.{what}"
    if layer is None:
        raise ValueError(f"act_name({what!r}) needs a layer")
    if what == "resid_pre":  # the stream that block ``layer`` reads; layer = n_layers gives the last output
        return act_name("embed", embedding=embedding) if layer == 0 else act_name("resid_post", layer - 1, stack=stack)
    if what == "resid_post":
        return f"{block_name(layer, stack)}.output"
    if what == "sublayer_out":
        if sublayer is None:
            raise ValueError("act_name('sublayer_out') needs the sublayer's name, e.g. 'ffn_sublayer'")
        return f"{block_name(layer, stack)}.{sublayer}.out"
    kinds = [*EMBEDDING, *ATTENTION, *MODEL, "resid_pre", "resid_post", "sublayer_out"]
    raise ValueError(f"unknown activation {what!r}: one of {', '.join(kinds)}")
