"""Run a model once on a text and keep every named intermediate: the one source of every view.

The views of :mod:`qkv.inspect` never re-implement a forward pass. They run the model's own ``forward``
inside :func:`qkv.layers.capture.capture`, which hands back the tensors each module recorded under its
dotted name (TransformerLens's ``run_with_cache``), and read what they show from there:

    embedding.tokens / .positions / .output          W_E rows, positional encodings, their sum
    decoder.blocks.{i}.self_attn.q / .k / .v          (B, h, T, d_k) queries, keys, values of head h
    decoder.blocks.{i}.self_attn.weights              (B, h, Tq, Tk) softmax(Q K^T / sqrt(d_k) + mask)
    decoder.blocks.{i}.self_attn.context              (B, h, T, d_k) the weighted sums of values
    logits                                            (B, T, vocab)

A model has up to three kinds of attention (the notes on Attention Is All You Need, "Practical application in
transformer"):

- ``encoder``: encoder self-attention, every position sees every position (BERT, a translator's encoder);
- ``decoder``: decoder self-attention, masked so that a position sees only itself and earlier positions
  (GPT's blocks, a translator's decoder);
- ``cross``: encoder-decoder attention, queries from the decoder, keys and values from the encoder output.
  RNNSearch has only this one, additive and with one head: ``decoder.attention.weights`` (B, 1, T, S).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.inspect.names import act_name, attention_name
from qkv.inspect.summary import ShortRepr
from qkv.inspect.tokens import token_labels
from qkv.layers.capture import capture
from qkv.model_dir import ModelBundle
from qkv.models.config import ModelConfig
from qkv.models.family import ENCODER, Family, family_of
from qkv.tokenizers import Tokenizer

if TYPE_CHECKING:
    from qkv.models.transformer import Transformer


@dataclass(frozen=True)
class Part:
    """One kind of attention in a model: where its modules live and which tokens are on each axis."""

    name: str  # "encoder", "decoder" or "cross"
    title: str  # e.g. "decoder masked self-attention"
    stack: str  # the module holding the blocks: "decoder", "encoder"
    attention: str  # the attention module in each block ("self_attn", "cross_attn"), or in the stack itself
    layered: bool  # one attention per block (False: RNNSearch's one attention, "decoder.attention")
    n_layers: int
    n_heads: int
    causal: bool  # the model applies the look-ahead mask here
    queries: str  # "source" or "target": the token stream the queries come from
    keys: str

    def module_name(self, layer: int) -> str:
        return attention_name(layer if self.layered else None, self.stack, self.attention)

    def act(self, layer: int, what: str) -> str:
        """The name of ``what`` ("q", "k", "v", "weights", "context") in ``layer``."""
        return act_name(what, layer if self.layered else None, stack=self.stack, attention=self.attention)


@dataclass(repr=False)
class Trace(ShortRepr):
    """A model's forward pass on one text: its tokens and every captured activation (batch of 1)."""

    model: nn.Module
    kind: str  # the model's family: "gpt", "llama", "encoder", "transformer" or "rnnsearch"
    source_ids: list[int]
    source_tokens: list[str]
    acts: dict[str, Tensor]
    target_ids: list[int] | None = None  # a translator's decoder input, <bos> first
    target_tokens: list[str] | None = None
    generated: bool = False  # True when the target was produced by greedy decoding
    parts: dict[str, Part] = field(default_factory=dict)

    def tokens(self, stream: str) -> list[str]:
        """The labels of the "source" or "target" token stream."""
        tokens = self.source_tokens if stream == "source" else self.target_tokens
        assert tokens is not None
        return tokens

    def part(self, name: str | None) -> Part:
        """The attention kind ``name`` ("encoder", "decoder", "cross"); None gives the model's first one."""
        if name is None:
            return next(iter(self.parts.values()))
        if name not in self.parts:
            family = family_of(self.kind)
            if name == "cross":  # a model without cross-attention: the family's one line
                family.require("cross-attention", "--part cross")
            raise QkvError(f"{family.title} has no {name} attention: choose --part from {', '.join(self.parts)}")
        return self.parts[name]

    def attention(self, part: Part, layer: int, what: str) -> Tensor:
        """The captured ``what`` ("q", "k", "v", "weights", "context") of one layer, batch item 0."""
        check_layer_head(part, layer, None)
        return self.acts[part.act(layer, what)][0]


def check_layer_head(part: Part, layer: int | None, head: int | None) -> None:
    """QkvError unless ``layer`` and ``head`` exist in ``part`` (None means "all")."""
    check_range(part.title, part.n_layers, part.n_heads, layer, head)


def check_range(title: str, n_layers: int, n_heads: int, layer: int | None, head: int | None) -> None:
    """QkvError unless 0 <= layer < n_layers and 0 <= head < n_heads (None means "all")."""
    if layer is not None and not 0 <= layer < n_layers:
        raise QkvError(f"--layer {layer} is out of range: the {title} has layers 0..{n_layers - 1}")
    if head is not None and not 0 <= head < n_heads:
        raise QkvError(f"--head {head} is out of range: each layer has heads 0..{n_heads - 1}")


def self_attention_title(family: Family, part: str) -> str:
    """How the views name ``part``'s self-attention: "masked self-attention", "encoder self-attention", ..."""
    title = "masked self-attention" if part in family.masked else "self-attention"
    return f"{part} {title}" if len(family.self_attention_parts) > 1 else title


def _parts(family: Family, acts: dict[str, Tensor]) -> dict[str, Part]:
    """Every kind of attention the family has, in the order the model runs them."""
    specs = [  # (name, title, stack, attention module, one per block, causal, queries, keys)
        (part, self_attention_title(family, part), family.streams[part][1], "self_attn", True, part in family.masked,
         family.side(part), family.side(part))
        for part in family.self_attention_parts
    ]  # fmt: skip
    if family.has("cross-attention"):
        specs.append(("cross", "cross-attention (decoder to encoder)", "decoder", "cross_attn", True, False,
                      "target", "source"))  # fmt: skip
    if family.has("alignment"):  # RNNSearch's one attention: additive, from the decoder state to the annotations
        specs.append(("cross", "additive attention (decoder to encoder)", "decoder", "attention", False, False,
                      "target", "source"))  # fmt: skip
    parts = {}
    for name, title, stack, attention, layered, causal, queries, keys in specs:
        part = Part(name, title, stack, attention, layered, 0, 0, causal, queries, keys)
        n_layers = 0
        while part.act(n_layers, "weights") in acts and (layered or n_layers == 0):
            n_layers += 1  # an attention outside the blocks is one layer
        n_heads = acts[part.act(0, "weights")].shape[1] if n_layers else 0  # (B, h, Tq, Tk)
        parts[name] = replace(part, n_layers=n_layers, n_heads=n_heads)
    return parts


def context_length(config: ModelConfig) -> int:
    """The positions ``config``'s model attends over, as its family describes them (Word2Vec has none, and every
    view that reads a text refuses it first)."""
    length = family_of(config).context_length(config)
    assert length is not None, f"a {config.kind} model has no context length"
    return length


def encode_text(tokenizer: Tokenizer, text: str, *, limit: int, what: str, specials: bool = False) -> list[int]:
    """Token ids of ``text`` (with <bos>/<eos> around it if ``specials`` and the tokenizer has them)."""
    if not text:
        raise QkvError(f"the {what} is empty: give some text")
    ids = tokenizer.encode(text)
    if specials and tokenizer.bos_id is not None and tokenizer.eos_id is not None:
        ids = [tokenizer.bos_id, *ids, tokenizer.eos_id]
    if not ids:
        raise QkvError(f"the {what} {text!r} gives no tokens: give some text")
    if len(ids) > limit:
        raise QkvError(
            f"the {what} is {len(ids)} tokens long but the model's context takes at most {limit}: shorten it"
        )
    return ids


@torch.no_grad()
def trace(bundle: ModelBundle, text: str, *, target: str | None = None) -> Trace:
    """Run ``bundle``'s model on ``text`` inside :func:`~qkv.layers.capture.capture` and keep everything.

    A GPT reads ``text`` as its context; an encoder reads it between its <bos>/<eos> tokens ([CLS] ... [SEP]
    for BERT); a translator reads it as the source and decodes ``target`` teacher-forced (``<bos>`` +
    target tokens), or, without ``target``, the translation greedy decoding produces, so that its decoder
    and cross-attention can be shown too.
    """
    model, config, tokenizer = bundle.model, bundle.config, bundle.tokenizer
    family = family_of(model)
    if not family.has("alignment"):
        family.require("self-attention heads", "tracing attention")
    if target and not family.two_vocabularies:  # it was ignored: the views showed the text alone
        raise QkvError(f"--target is for translators: {family.title} reads one text (drop target)")
    model.eval()
    if family.two_vocabularies:
        result = _trace_translator(bundle, text, target)
    else:  # one text; an encoder reads it between its <bos>/<eos> ([CLS] ... [SEP])
        ids = encode_text(tokenizer, text, limit=context_length(config), what="text", specials=family.role == ENCODER)
        with capture(model) as acts:
            model(torch.tensor([ids], device=_device(model)))
        result = Trace(model, config.kind, ids, token_labels(tokenizer, ids), acts)
    result.parts = _parts(family, result.acts)
    return result


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def decoder_input(bundle: ModelBundle, text: str, target: str | None) -> tuple[list[int], list[int], bool]:
    """A translator's source ids and decoder input ``[<bos>, target...]``; greedy-decoded if ``target`` is None."""
    from qkv.decoding.beam_search import greedy_decode

    model, config = bundle.model, bundle.config
    source_tok = bundle.tokenizer
    target_tok = bundle.target_tokenizer or source_tok
    if target_tok.bos_id is None or target_tok.eos_id is None:
        raise QkvError("the target tokenizer has no <bos> or <eos> token: a translator needs both to decode")
    src = encode_text(source_tok, text, limit=context_length(config), what="source text")
    if target is None:
        src_ids = torch.tensor([src], device=_device(model))
        translator = cast("Transformer", model)  # or RNNSearch: the same encode/decode
        out = greedy_decode(translator, src_ids, bos_id=target_tok.bos_id, eos_id=target_tok.eos_id)[0]
        generated = True
    else:
        out = target_tok.encode(target)
        generated = False
        if len(out) >= context_length(config):  # refused like a source that long, never cut without a word
            raise QkvError(
                f"the target text is {len(out)} tokens long but the model's context takes at most "
                f"{context_length(config) - 1} after <bos>: shorten it"
            )
    tgt = [target_tok.bos_id, *out][: context_length(config)]  # a greedy translation stops at the context
    return src, tgt, generated


def _trace_translator(bundle: ModelBundle, text: str, target: str | None) -> Trace:
    model = bundle.model
    target_tok = bundle.target_tokenizer or bundle.tokenizer
    src, tgt, generated = decoder_input(bundle, text, target)
    device = _device(model)
    with capture(model) as acts:
        model(torch.tensor([src], device=device), torch.tensor([tgt], device=device))
    return Trace(
        model,
        bundle.config.kind,
        src,
        token_labels(bundle.tokenizer, src),
        acts,
        target_ids=tgt,
        target_tokens=token_labels(target_tok, tgt),
        generated=generated,
    )
