"""Attention weights for the playground, read from the model's own forward pass with :func:`qkv.capture`.

Each attention module records its weights softmax(QK^T / sqrt(d_k)) (B, h, T_q, T_k) under its dotted name;
this module gathers them per kind of attention into ``weights[layer][head][query][key]``:

- a GPT has causal self-attention only ("self": ``decoder.blocks.{i}.self_attn``);
- an encoder has bidirectional self-attention ("self": ``encoder.blocks.{i}.self_attn``);
- a translator has three: the encoder's self-attention over the source ("encoder"), the decoder's masked
  self-attention over the target ("decoder"), and the decoder's cross-attention from target to source
  ("cross": the alignment between the two sentences); an RNNSearch has only the last, additive, one head.

The translator is run teacher-forced on ``<bos>`` + target, so decoder row i is the position that predicts
target token i (``<eos>`` after the last one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qkv.decoding.beam_search import greedy_decode
from qkv.layers.capture import capture
from qkv.server.schemas import AttentionMap, AttentionResponse
from qkv.tokenizers import Tokenizer

if TYPE_CHECKING:
    from qkv.server.service import Service


def _stack(acts: dict[str, torch.Tensor], prefix: str, module: str, n_layers: int, decimals: int) -> list:
    """``acts["{prefix}.blocks.{i}.{module}.weights"][0]`` for every layer, rounded: [layer][head][q][k]."""
    weights = torch.stack([acts[f"{prefix}.blocks.{i}.{module}.weights"][0] for i in range(n_layers)])  # (L, h, Tq, Tk)
    return _rounded(weights, decimals)


def _rounded(weights: torch.Tensor, decimals: int) -> list:
    """(L, h, Tq, Tk) weights as nested lists, rounded to ``decimals``."""
    scale = 10.0**decimals
    return weights.double().mul(scale).round().div(scale).tolist()


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """What one token looks like as text; the stored vocabulary entry when it is not text on its own
    (half of a UTF-8 character, or a special token that decodes to nothing)."""
    text = tokenizer.decode([token_id], skip_special=False)
    return text if text and "\ufffd" not in text else tokenizer.id_to_token(token_id)


def _texts(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    return [token_text(tokenizer, i) for i in ids]


def self_maps(service: Service, ids: list[int], decimals: int) -> AttentionResponse:
    """A GPT's or an encoder's self-attention over ``ids``."""
    model, config = service.model, service.config
    with capture(model) as acts:
        model(torch.tensor([ids], device=service.device))
    if service.kind == "gpt":
        prefix, text = "decoder", "causal self-attention: each token looks at itself and the tokens before it"
    else:
        prefix, text = "encoder", "self-attention: each token looks at every token of the text"
    weights = _stack(acts, prefix, "self_attn", config.n_layers, decimals)
    return AttentionResponse(
        kind=service.kind,
        tokens=_texts(service.tokenizer, ids),
        maps=[AttentionMap(name="self", description=text, queries="tokens", keys="tokens", weights=weights)],
    )


def greedy_target(model: torch.nn.Module, src: list[int], target_tokenizer: Tokenizer) -> list[int]:
    """The model's own greedy translation of the source ids (no <bos>/<eos>)."""
    ids = torch.tensor([src], device=next(model.parameters()).device)
    return greedy_decode(model, ids, bos_id=target_tokenizer.bos_id, eos_id=target_tokenizer.eos_id)[0]


def translator_maps(service: Service, src: list[int], target: list[int], decimals: int) -> AttentionResponse:
    """The encoder's, the decoder's and the cross-attention of a translator reading ``src`` and writing ``target``."""
    model, config, tgt_tok = service.model, service.config, service.target_tokenizer
    decoder_input = [tgt_tok.bos_id, *target]
    device = service.device
    with capture(model) as acts:
        model(torch.tensor([src], device=device), torch.tensor([decoder_input], device=device))
    if service.kind == "rnnsearch":  # one attention, additive: the alignment of Bahdanau et al. 2015
        alignment = AttentionMap(
            name="cross",
            description="additive attention: while writing each target token, where the decoder's state looks "
            "in the source (the alignment)",
            queries="target_tokens",
            keys="tokens",
            weights=_rounded(acts["decoder.attention.weights"][None, 0], decimals),  # (1 layer, 1 head, Tq, Tk)
        )
        return _translator_response(service, src, target, [alignment])
    n_enc, n_dec = config.n_encoder_layers, config.n_decoder_layers
    maps = [
        AttentionMap(
            name="encoder",
            description="encoder self-attention: each source token looks at every source token",
            queries="tokens",
            keys="tokens",
            weights=_stack(acts, "encoder", "self_attn", n_enc, decimals),
        ),
        AttentionMap(
            name="decoder",
            description="decoder masked self-attention: each target position looks at itself and the ones before",
            queries="target_tokens",
            keys="target_tokens",
            weights=_stack(acts, "decoder", "self_attn", n_dec, decimals),
        ),
        AttentionMap(
            name="cross",
            description="cross-attention: while writing each target token, where the decoder looks in the source",
            queries="target_tokens",
            keys="tokens",
            weights=_stack(acts, "decoder", "cross_attn", n_dec, decimals),
        ),
    ]
    return _translator_response(service, src, target, maps)


def _translator_response(service: Service, src: list[int], target: list[int], maps: list) -> AttentionResponse:
    tgt_tok = service.target_tokenizer
    return AttentionResponse(
        kind=service.kind,
        tokens=_texts(service.tokenizer, src),
        target_tokens=_texts(tgt_tok, [tgt_tok.bos_id, *target]),
        predicted_tokens=_texts(tgt_tok, [*target, tgt_tok.eos_id]),
        target_text=tgt_tok.decode(target),
        maps=maps,
    )
