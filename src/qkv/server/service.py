"""Model access for the server: the limits it serves under, and each endpoint's work as one plain function.

The server is a thin layer: the numbers come from the functions the command line uses. The next-token
distribution is :func:`qkv.inspect.next_token` (``qkv next``), the attention maps
:func:`qkv.inspect.attention_maps` (``qkv attention``), the walk-through :func:`qkv.inspect.walkthrough`
(``qkv lens --html``), token labels :mod:`qkv.inspect.tokens`, generation
:func:`qkv.decoding.stream` (``qkv generate``) and translation :class:`qkv.decoding.translator.Translator`
(``qkv translate``). This module checks a request against the limits and turns their results into JSON.

Every method here is plain synchronous torch code; the app runs it in a worker thread so the event loop keeps
answering other clients. One model serves every request at once, which is safe because nothing a request
does changes it: the model stays in eval mode, every forward pass runs without gradients (grad mode is per
thread), activations are captured per context, and each request gets its own KV cache and its own
``torch.Generator``. So one client's temperature or seed can never reach another's tokens.

:class:`Gate` bounds how many generations run at once; requests beyond that wait a little, then are refused
with 503 rather than piling up.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from qkv.decoding.translator import Translator
from qkv.errors import QkvError
from qkv.inspect.attention_maps import maps_from_trace
from qkv.inspect.next_token import next_token
from qkv.inspect.tokens import token_text
from qkv.inspect.trace import trace
from qkv.inspect.walkthrough import walkthrough
from qkv.model_dir import ModelBundle
from qkv.models.family import LANGUAGE_MODEL, TRANSLATOR, Family, family_of
from qkv.server.completion import CompletionJob, check_request, read_prompts
from qkv.server.errors import ServiceError
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread
from qkv.server.notes import add_note
from qkv.server.pool import make_scheduler
from qkv.server.schemas import (
    AttentionRequest,
    AttentionResponse,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelInfo,
    NextTokenRequest,
    NextTokenResponse,
    TokenizeRequest,
    TokenizeResponse,
    TokenProbability,
    Translation,
    TranslationRequest,
    TranslationResponse,
    Usage,
    WalkthroughRequest,
)
from qkv.server.translations import TranslationBatches
from qkv.tokenizers.base import unknown_note


def _attention(family: Family) -> None:
    """Attention weights to show: self-attention heads, or RNNSearch's alignment (its one additive attention)."""
    if not family.has("alignment"):
        family.require("self-attention heads", "tracing attention")


# What each model endpoint needs from the model's family (qkv.models.family). A family that lacks it gets
# the family's one line, the same the command line gives for the same view ("the walk-through", ...).
NEEDS: dict[str, Callable[[Family], None]] = {
    "/v1/completions": lambda family: family.require_role(LANGUAGE_MODEL, "/v1/completions"),
    "/v1/translations": lambda family: family.require_role(TRANSLATOR, "/v1/translations"),
    "/v1/next-token": lambda family: family.require("unembedding", "next-token prediction"),
    "/v1/attention": _attention,
    "/v1/walkthrough": lambda family: family.require_role(LANGUAGE_MODEL, "the walk-through"),
}
COMMON_ENDPOINTS = ["/v1/model", "/v1/models", "/tokenize", "/detokenize", "/health"]


def refusals(family: Family) -> dict[str, str]:
    """The model endpoints ``family`` lacks, each with the line that refuses it."""
    refused = {}
    for endpoint, need in NEEDS.items():
        try:
            need(family)
        except QkvError as error:
            refused[endpoint] = str(error)
    return refused


@dataclass
class Limits:
    """What one request may ask for, and how many generations run at once (the ``qkv serve`` flags)."""

    max_prompt_tokens: int = 1024  # longer prompts (or texts, or source sentences) get 413
    max_tokens: int = 512  # a larger max_tokens gets 400
    max_concurrent: int = 2  # generations at once; others wait up to queue_timeout seconds, then get 503
    queue_timeout: float = 10.0
    max_n: int = 8  # completions per prompt (n)
    max_logprobs: int = 5  # top alternatives per token (logprobs), as OpenAI
    max_request_bytes: int = 1_048_576  # a larger body gets 413 before it is read
    max_batch: int = 16  # rows of the batched scheduler's KV cache pool (sequences decoded together)
    kv_tokens: int = 0  # the pool's bound in cache positions (0: none beyond max_batch)
    kv_memory_mb: float = 0.0  # the pool's bound in MiB (0: none beyond max_batch)

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens", "max_concurrent", "max_n", "max_request_bytes", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("kv_tokens", "kv_memory_mb"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0: no bound), got {getattr(self, name)}")
        if self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be >= 0, got {self.max_logprobs}")
        if not self.queue_timeout >= 0:
            raise ValueError(f"queue_timeout must be >= 0 seconds, got {self.queue_timeout}")


class Gate:
    """At most ``slots`` holders at once. :meth:`enter` waits up to ``timeout`` seconds, then raises 503.

    Used from the event loop only (an asyncio semaphore); the work it guards runs in threads.
    """

    def __init__(self, slots: int, timeout: float, what: str) -> None:
        self.slots, self.timeout, self.what = slots, timeout, what
        self.active = self.waiting = 0
        self._semaphore = asyncio.Semaphore(slots)

    async def enter(self) -> None:
        self.waiting += 1
        try:
            async with asyncio.timeout(self.timeout):
                await self._semaphore.acquire()
        except TimeoutError:
            raise ServiceError(
                503,
                f"the server is busy: {self.active} {self.what} running (at most {self.slots} at once, "
                f"--max-concurrent) and none finished within {self.timeout:g} s; try again shortly",
                kind="server_busy",
                code="server_busy",
                headers={"Retry-After": "1"},
            ) from None
        finally:
            self.waiting -= 1
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        self._semaphore.release()


class Service:
    """A loaded model and the limits it is served under."""

    def __init__(
        self,
        bundle: ModelBundle,
        limits: Limits | None = None,
        *,
        name: str | None = None,
        scheduler: str = "batched",
        engine: str = "auto",
    ) -> None:
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.config = bundle.config
        self.family = family_of(self.model)
        self.kind = self.family.name
        self.refused = refusals(self.family)
        if all(endpoint in self.refused for endpoint in NEEDS):
            raise QkvError(f"qkv serve has nothing to show for {self.family.title}: {self.family.instead}")
        self.tokenizer = bundle.tokenizer
        self.target_tokenizer = bundle.target_tokenizer or bundle.tokenizer
        self.limits = limits or Limits()
        self.name = name or bundle.path.name or str(bundle.path)
        self.device = next(self.model.parameters()).device
        self.translator = (
            Translator(self.model, self.tokenizer, self.target_tokenizer) if self.family.two_vocabularies else None
        )
        self.generations = Gate(self.limits.max_concurrent, self.limits.queue_timeout, "generations")
        # One forward pass each (next-token, attention): their own gate, so the playground's chart keeps
        # updating while a generation streams.
        self.analyses = Gate(self.limits.max_concurrent, self.limits.queue_timeout, "analyses")
        self.engine = engine
        self.metrics = Metrics()
        self.model_thread = ModelThread()  # every forward pass runs there (qkv.server.model_thread)
        self.scheduler = make_scheduler(self, scheduler, engine) if "/v1/completions" not in self.refused else None
        self.translations = None  # --scheduler sequential: each request alone, through the generations gate
        if self.translator is not None and scheduler == "batched":
            limits = self.limits
            self.translations = TranslationBatches(
                self.translate_texts, limits.max_batch, limits.queue_timeout, run=self.model_thread.run
            )

    # -------------------------------------------------------------------------------- what it serves

    @property
    def endpoints(self) -> list[str]:
        return [endpoint for endpoint in NEEDS if endpoint not in self.refused] + COMMON_ENDPOINTS

    def require(self, endpoint: str) -> None:
        """404 with the family's one line unless this model's family offers ``endpoint``."""
        if endpoint in self.refused:
            raise ServiceError(404, self.refused[endpoint], code="endpoint_not_found")

    def check_model(self, model: str | None) -> None:
        """404 (OpenAI's model_not_found) unless ``model`` is None or the served model's id."""
        if model is not None and model not in (self.name, str(self.bundle.path)):
            raise ServiceError(
                404,
                f"the model {model!r} does not exist here: this server runs {self.name!r} (GET /v1/models)",
                param="model",
                code="model_not_found",
            )

    @property
    def context_length(self) -> int:
        return self.config.context_length

    def info(self) -> ModelInfo:
        c, family = self.config, self.family
        two = family.two_vocabularies  # a translator: two stacks, two vocabularies
        vocab = [getattr(c, name) for name in family.vocab_fields]
        return ModelInfo(
            name=self.name,
            kind=self.kind,
            role=family.role,
            description=family.title,
            path=str(self.bundle.path),
            parameters=sum(p.numel() for p in self.model.parameters()),
            layers=c.n_encoder_layers + c.n_decoder_layers if two else c.n_layers,
            encoder_layers=c.n_encoder_layers if two else None,
            decoder_layers=c.n_decoder_layers if two else None,
            heads=c.n_heads,
            d_model=c.d_model,
            context_length=self.context_length,
            vocab_size=vocab[0],
            target_vocab_size=vocab[1] if two else None,
            tokenizer=getattr(self.tokenizer, "kind", type(self.tokenizer).__name__),
            capabilities=sorted(family.capabilities),
            endpoints=self.endpoints,
            unavailable=self.refused,
            limits={k: float(v) for k, v in asdict(self.limits).items()},
        )

    # ------------------------------------------------------------------------------------ checking

    def encode(self, text: str, what: str = "prompt", *, target: bool = False) -> list[int]:
        """Token ids of ``text``, or 413 when it has more than --max-prompt-tokens tokens."""
        tokenizer = self.target_tokenizer if target else self.tokenizer
        ids = tokenizer.encode(text)
        self.check_length(len(ids), what)
        add_note(unknown_note(tokenizer, text, f"the {what}", ids))
        return ids

    def check_length(self, n: int, what: str) -> None:
        limit = self.limits.max_prompt_tokens
        if n > limit:
            raise ServiceError(
                413,
                f"the {what} has {n} tokens, more than the {limit} accepted (--max-prompt-tokens): shorten it",
                param="prompt",
                code="context_length_exceeded",
            )

    def completion(self, request: CompletionRequest) -> CompletionJob:
        """Check a completion request and prepare its generation (nothing runs until it is iterated)."""
        check_request(self, request)
        prompts = read_prompts(self, request)
        if request.echo and request.logprobs is not None:  # the prompt's logprobs: here, not in the decoding loop
            for prompt in prompts:
                prompt.entries(self, request.logprobs)
        return CompletionJob(self, request, prompts)

    # ---------------------------------------------------------------------------------- model work

    def next_token(self, request: NextTokenRequest) -> NextTokenResponse:
        """:func:`qkv.inspect.next_token` at the request's temperature, top-k and top-p (``qkv next``'s numbers)."""
        two = self.family.two_vocabularies
        source = self.encode(request.prompt, "source sentence" if two else "prompt")
        result = next_token(
            self.bundle,
            request.prompt,
            temperatures=[request.temperature],
            top=request.n,
            target_prefix=request.target,
            top_k=request.top_k,
            top_p=request.top_p,
        )
        probs, model_probs = result.probabilities[0], result.model_probabilities
        tokenizer = self.target_tokenizer if two else self.tokenizer
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

    def attention(self, request: AttentionRequest) -> AttentionResponse:
        """:func:`qkv.inspect.attention_maps`' numbers (``qkv attention --json``), rounded to ``decimals`` places."""
        two = self.family.two_vocabularies
        self.encode(request.text, "source sentence" if two else "text")
        if request.target is not None and not two:
            raise ServiceError(400, f"target is for translators: {self.family.title} reads one text", param="target")
        traced = trace(self.bundle, request.text, target=request.target)
        data = maps_from_trace(traced).to_dict(request.decimals)
        for name, group in data["groups"].items():
            group["description"] = self.family.attention_notes.get(name, group["title"])
        if traced.target_ids is not None:
            data["target_text"] = self.target_tokenizer.decode(traced.target_ids[1:])
        return AttentionResponse(**data)

    def walkthrough(self, request: WalkthroughRequest) -> dict:
        """:func:`qkv.inspect.walkthrough`'s numbers for the playground's walk-through (language models)."""
        self.encode(request.text, "text")
        result = walkthrough(self.bundle, request.text, top=request.top, vocab=request.logits)
        return {"model": self.name, **result.to_dict(request.decimals, logits=request.logits)}

    def check_translation(self, request: TranslationRequest) -> tuple[list[str], int]:
        """The request's sentences and their number of source tokens, or the error that refuses it."""
        texts = [request.text] if isinstance(request.text, str) else list(request.text)
        source_tokens = 0
        for text in texts:
            ids = self.encode(text, "source sentence")
            if not ids:
                raise ServiceError(400, "a source sentence has no tokens: give some text to translate")
            if len(ids) > self.context_length:
                raise ServiceError(
                    413,
                    f"a source sentence has {len(ids)} tokens, more than the model's context "
                    f"({self.context_length}): shorten it",
                    code="context_length_exceeded",
                )
            source_tokens += len(ids)
        return texts, source_tokens

    def translate_texts(self, texts: list[str], beam: int) -> list[str]:
        """The best translation of each sentence, greedy or with beam search (``beam`` > 1), in one call."""
        with torch.inference_mode():
            return self.translator.translate(texts, beam=beam)

    def translation_response(self, outputs: list[str], source_tokens: int) -> TranslationResponse:
        target_tokens = sum(len(self.target_tokenizer.encode(text)) for text in outputs)
        return TranslationResponse(
            model=self.name,
            translations=[Translation(text=text, index=i) for i, text in enumerate(outputs)],
            usage=Usage(
                prompt_tokens=source_tokens, completion_tokens=target_tokens, total_tokens=source_tokens + target_tokens
            ),
        )

    # ---------------------------------------------------------------------------------- tokenizers

    def tokenize(self, request: TokenizeRequest) -> TokenizeResponse:
        self.check_model(request.model)
        tokenizer = self._tokenizer(request.target)
        ids = tokenizer.encode(request.prompt)
        strs = [tokenizer.id_to_token(i) for i in ids] if request.return_token_strs else None
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=self.context_length, token_strs=strs)

    def detokenize(self, request: DetokenizeRequest) -> DetokenizeResponse:
        self.check_model(request.model)
        tokenizer = self._tokenizer(request.target)
        bad = [t for t in request.tokens if not 0 <= t < tokenizer.vocab_size]
        if bad:
            raise ServiceError(
                400,
                f"token id {bad[0]} is outside this model's vocabulary (0..{tokenizer.vocab_size - 1})",
                param="tokens",
                code="invalid_token_id",
            )
        try:
            return DetokenizeResponse(prompt=tokenizer.decode(request.tokens))
        except QkvError as error:
            raise ServiceError(400, str(error), param="tokens") from None

    def _tokenizer(self, target: bool):
        if target and not self.family.two_vocabularies:
            raise ServiceError(400, f"target is for translators: {self.family.title} has one tokenizer", param="target")
        return self.target_tokenizer if target else self.tokenizer


def _finite(value: float) -> float:
    """JSON has no infinities: a masked logit is reported as a very negative number."""
    return value if math.isfinite(value) else -1e30
