"""The analysis views as JSON: the next-token distribution, attention maps and the walk-through.

The numbers come from the functions the command line uses (:func:`qkv.inspect.next_token` for ``qkv next``,
:func:`qkv.inspect.attention_maps` for ``qkv attention``, :func:`qkv.inspect.walkthrough` for the walk-through
page); this module only checks the request and turns their results into the response models. Each function is
plain synchronous torch code, run on the model thread.
"""

from __future__ import annotations

import math
from typing import cast

from qkv.inspect.attention_maps import maps_from_trace
from qkv.inspect.next_token import next_token
from qkv.inspect.tokens import token_text
from qkv.inspect.trace import trace
from qkv.inspect.walkthrough import walkthrough
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
from qkv.server.config_shape import DecoderConfig
from qkv.server.errors import ServiceError
from qkv.server.jobs import check_prompt_length
from qkv.server.limits import Limits
from qkv.server.notes import add_note
from qkv.server.schemas import (
    AttentionRequest,
    AttentionResponse,
    NextTokenRequest,
    NextTokenResponse,
    TokenProbability,
    WalkthroughRequest,
)
from qkv.tokenizers.base import Tokenizer
from qkv.tokenizers.unknown import unknown_note


def encode_checked(tokenizer: Tokenizer, text: str, limits: Limits, what: str) -> list[int]:
    """Token ids of ``text``, or 413 when it has more than --max-prompt-tokens tokens (a note names unknown
    characters)."""
    ids = tokenizer.encode(text)
    check_prompt_length(len(ids), limits, what)
    add_note(unknown_note(tokenizer, text, f"the {what}", ids))
    return ids


MAX_WEIGHTS = 4_000_000  # attention weights one answer may carry: about 30 MB of JSON


def check_view_size(bundle: ModelBundle, n_tokens: int, what: str) -> None:
    """413 when a language model's attention maps for ``n_tokens`` tokens, layers x heads x T^2 weights, would be
    more than :data:`MAX_WEIGHTS` (SmolLM2's 30 x 9 heads over 1,000 tokens are 270 million: gigabytes of JSON a
    browser cannot take). A translator's maps are smaller models' and pass."""
    family = family_of(bundle.model)
    if family.two_vocabularies or not family.has("self-attention heads"):
        return
    config = cast(DecoderConfig, bundle.config)
    heads = config.n_layers * config.n_heads
    if heads * n_tokens**2 > MAX_WEIGHTS:
        most = math.isqrt(MAX_WEIGHTS // heads)
        raise ServiceError(
            413,
            f"{what} of {config.n_layers} layers x {config.n_heads} heads over {n_tokens} tokens would be "
            f"{heads * n_tokens**2:,} attention weights, more than the {MAX_WEIGHTS:,} one answer carries: "
            f"shorten the text to {most} tokens (or use qkv attention / qkv lens --html on the command line)",
            param="text",
            code="context_length_exceeded",
        )


def _finite(value: float) -> float:
    """JSON has no infinities: a masked logit is reported as a very negative number."""
    return value if math.isfinite(value) else -1e30


def next_token_view(bundle: ModelBundle, limits: Limits, request: NextTokenRequest) -> NextTokenResponse:
    """:func:`qkv.inspect.next_token` at the request's temperature, top-k and top-p (``qkv next``'s numbers)."""
    two = family_of(bundle.model).two_vocabularies
    source = encode_checked(bundle.tokenizer, request.prompt, limits, "source sentence" if two else "prompt")
    result = next_token(
        bundle,
        request.prompt,
        temperatures=[request.temperature],
        top=request.n,
        target_prefix=request.target,
        top_k=request.top_k,
        top_p=request.top_p,
    )
    probs, model_probs = result.probabilities[0], result.model_probabilities
    tokenizer = (bundle.target_tokenizer or bundle.tokenizer) if two else bundle.tokenizer
    return NextTokenResponse(
        tokens=[
            TokenProbability(
                id=i,
                token=tokenizer.id_to_token(i),
                text=token_text(tokenizer, i),
                label=label,
                logit=_finite(float(result.logits[i])),
                prob=float(probs[i]),
                prob_t1=float(model_probs[i]),
            )
            for i, label in zip(result.top_ids, result.top_tokens, strict=True)
        ],
        temperature=request.temperature,
        top_k=request.top_k,
        top_p=request.top_p,
        context_tokens=len(source) if two else len(result.context_tokens),
        cropped=result.cropped,
        kept=result.kept()[0],
        entropy_bits=result.entropy()[0] / math.log(2),
    )


def attention_view(bundle: ModelBundle, limits: Limits, request: AttentionRequest) -> AttentionResponse:
    """:func:`qkv.inspect.attention_maps`' numbers (``qkv attention --json``), rounded to ``decimals`` places."""
    family = family_of(bundle.model)
    two = family.two_vocabularies
    ids = encode_checked(bundle.tokenizer, request.text, limits, "source sentence" if two else "text")
    check_view_size(bundle, len(ids), "the attention view")
    if request.target is not None and not two:
        raise ServiceError(400, f"target is for translators: {family.title} reads one text", param="target")
    traced = trace(bundle, request.text, target=request.target)
    data = maps_from_trace(traced).to_dict(request.decimals)
    for name, group in data["groups"].items():
        group["description"] = family.attention_notes.get(name, group["title"])
    if traced.target_ids is not None:
        data["target_text"] = (bundle.target_tokenizer or bundle.tokenizer).decode(traced.target_ids[1:])
    return AttentionResponse(**data)


def walkthrough_view(bundle: ModelBundle, limits: Limits, request: WalkthroughRequest, name: str) -> dict:
    """:func:`qkv.inspect.walkthrough`'s numbers for the playground's walk-through (language models)."""
    ids = encode_checked(bundle.tokenizer, request.text, limits, "text")
    check_view_size(bundle, len(ids), "the walk-through")
    result = walkthrough(bundle, request.text, top=request.top, vocab=request.logits)
    return {"model": name, **result.to_dict(request.decimals, logits=request.logits)}
