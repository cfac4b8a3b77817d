"""The analysis views as JSON: the next-token distribution, attention maps and the walk-through.

The numbers come from the functions the command line uses (:func:`qkv.inspect.next_token` for ``qkv next``,
:func:`qkv.inspect.attention_maps` for ``qkv attention``, :func:`qkv.inspect.walkthrough` for the walk-through
page); this module only checks the request and turns their results into the response models. Each function is
plain synchronous torch code, run on the model thread.
"""

from __future__ import annotations

import math

from qkv.inspect.attention_maps import maps_from_trace
from qkv.inspect.next_token import next_token
from qkv.inspect.tokens import token_text
from qkv.inspect.trace import trace
from qkv.inspect.walkthrough import walkthrough
from qkv.model_dir import ModelBundle
from qkv.models.family import family_of
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
from qkv.tokenizers.base import Tokenizer, unknown_note


def encode_checked(tokenizer: Tokenizer, text: str, limits: Limits, what: str) -> list[int]:
    """Token ids of ``text``, or 413 when it has more than --max-prompt-tokens tokens (a note names unknown
    characters)."""
    ids = tokenizer.encode(text)
    check_prompt_length(len(ids), limits, what)
    add_note(unknown_note(tokenizer, text, f"the {what}", ids))
    return ids


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
    encode_checked(bundle.tokenizer, request.text, limits, "source sentence" if two else "text")
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
    encode_checked(bundle.tokenizer, request.text, limits, "text")
    result = walkthrough(bundle, request.text, top=request.top, vocab=request.logits)
    return {"model": name, **result.to_dict(request.decimals, logits=request.logits)}
