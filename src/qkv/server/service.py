"""Model access for the server: generation, the next-token distribution, attention weights, translation.

Every method here is plain synchronous torch code; the app runs it in a worker thread so the event loop keeps
answering other clients. One model serves every request at once, which is safe because nothing a request
does changes it: the model stays in eval mode, every forward pass runs under ``torch.inference_mode`` (grad
mode is per thread), and each request gets its own KV cache and its own ``torch.Generator``, seeded from the
request's ``seed`` or freshly. So one client's temperature or seed can never reach another's tokens.

:class:`Gate` bounds how many generations run at once; requests beyond that wait a little, then are refused
with 503 rather than piling up.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import torch

from qkv.decoding import TextStreamer, stream
from qkv.decoding.sampling import top_k_filter, top_p_filter
from qkv.decoding.translator import Translator
from qkv.layers.softmax import softmax
from qkv.model_dir import ModelBundle
from qkv.models.config import TRANSLATORS
from qkv.server import attention
from qkv.server.attention import token_text
from qkv.server.schemas import (
    AttentionRequest,
    AttentionResponse,
    CompletionRequest,
    ModelInfo,
    NextTokenRequest,
    NextTokenResponse,
    TokenProbability,
    Translation,
    TranslationRequest,
    TranslationResponse,
    Usage,
)
from qkv.tokenizers import Tokenizer

ENDPOINTS = {
    "gpt": ["/v1/completions", "/v1/next-token", "/v1/attention"],
    "transformer": ["/v1/translations", "/v1/next-token", "/v1/attention"],
    "rnnsearch": ["/v1/translations", "/v1/next-token", "/v1/attention"],
    "encoder": ["/v1/attention"],
}
COMMON_ENDPOINTS = ["/v1/model", "/v1/models", "/health"]
DESCRIPTIONS = {
    "gpt": "a GPT language model (decoder only)",
    "transformer": "an encoder-decoder translator",
    "rnnsearch": "an RNN encoder-decoder translator with additive attention (RNNSearch)",
    "encoder": "an encoder (BERT family)",
}


@dataclass
class Limits:
    """What one request may ask for, and how many generations run at once (the ``qkv serve`` flags)."""

    max_prompt_tokens: int = 1024  # longer prompts (or texts, or source sentences) get 413
    max_tokens: int = 512  # a larger max_tokens gets 400
    max_concurrent: int = 2  # generations at once; others wait up to queue_timeout seconds, then get 503
    queue_timeout: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_prompt_tokens", "max_tokens", "max_concurrent"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.queue_timeout >= 0:
            raise ValueError(f"queue_timeout must be >= 0 seconds, got {self.queue_timeout}")


class ServiceError(Exception):
    """A request the server refuses: an HTTP status and a sentence saying why and what to do instead."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", headers=None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.headers = status, message, kind, headers


class Gate:
    """At most ``slots`` holders at once. :meth:`enter` waits up to ``timeout`` seconds, then raises 503.

    Used from the event loop only (an asyncio semaphore); the work it guards runs in threads.
    """

    def __init__(self, slots: int, timeout: float, what: str) -> None:
        self.slots, self.timeout, self.what = slots, timeout, what
        self.active = 0
        self._semaphore = asyncio.Semaphore(slots)

    async def enter(self) -> None:
        try:
            async with asyncio.timeout(self.timeout):
                await self._semaphore.acquire()
        except TimeoutError:
            raise ServiceError(
                503,
                f"the server is busy: {self.active} {self.what} running (at most {self.slots} at once, "
                f"--max-concurrent) and none finished within {self.timeout:g} s; try again shortly",
                kind="server_busy",
                headers={"Retry-After": "1"},
            ) from None
        self.active += 1

    def leave(self) -> None:
        self.active -= 1
        self._semaphore.release()


class Completion:
    """One generation from a GPT. Iterating yields the new text piece by piece as tokens are made;
    afterwards ``completion_tokens`` and ``finish_reason`` ("stop" at <eos>, else "length") are set."""

    def __init__(self, service: Service, request: CompletionRequest, prompt_ids: list[int]) -> None:
        tokenizer = service.tokenizer
        self.prompt_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.cropped = 0
        self.generator = torch.Generator(device=service.device)
        if request.seed is None:
            self.generator.seed()  # fresh, nondeterministic
        else:
            self.generator.manual_seed(request.seed)
        self._eos = None if request.ignore_eos else tokenizer.eos_id
        self._streamer = TextStreamer(tokenizer, prompt_ids=prompt_ids)
        self._tokens = stream(
            service.model,
            prompt_ids,
            max_new_tokens=request.max_tokens,
            temperature=request.temperature,
            top_k=request.top_k or None,
            top_p=request.top_p,
            eos_id=self._eos,
            generator=self.generator,
            on_crop=self._on_crop,
        )
        self._pieces = self._run()

    def _on_crop(self, dropped: int) -> None:
        self.cropped = dropped

    def __iter__(self) -> Iterator[str]:
        return self._pieces

    def _run(self) -> Iterator[str]:
        # No grad-mode block here: this generator resumes on whichever worker thread asks for the next piece,
        # and grad mode is per thread. ``stream`` itself switches gradients off around each of its steps.
        for token in self._tokens:
            self.completion_tokens += 1
            if token == self._eos:
                self.finish_reason = "stop"
                break
            piece = self._streamer.push(token)
            if piece:
                yield piece
        if self.finish_reason is None:  # max_tokens reached
            self.finish_reason = "length"
        tail = self._streamer.flush()
        if tail:
            yield tail

    def close(self) -> None:
        """Stop early (the client went away): the model leaves its generation loop."""
        self._pieces.close()
        self._tokens.close()


class Service:
    """A loaded model and the limits it is served under."""

    def __init__(self, bundle: ModelBundle, limits: Limits | None = None, *, name: str | None = None) -> None:
        self.bundle = bundle
        self.model = bundle.model.eval()
        self.config = bundle.config
        self.kind: str = bundle.config.kind
        self.tokenizer = bundle.tokenizer
        self.target_tokenizer = bundle.target_tokenizer or bundle.tokenizer
        self.limits = limits or Limits()
        self.name = name or bundle.path.name or str(bundle.path)
        self.device = next(self.model.parameters()).device
        self.translator = (
            Translator(self.model, self.tokenizer, self.target_tokenizer) if self.kind in TRANSLATORS else None
        )
        self.generations = Gate(self.limits.max_concurrent, self.limits.queue_timeout, "generations")
        # One forward pass each (next-token, attention): their own gate, so the playground's chart keeps
        # updating while a generation streams.
        self.analyses = Gate(self.limits.max_concurrent, self.limits.queue_timeout, "analyses")

    # -------------------------------------------------------------------------------- what it serves

    @property
    def endpoints(self) -> list[str]:
        return ENDPOINTS[self.kind] + COMMON_ENDPOINTS

    def require(self, endpoint: str) -> None:
        """404 unless this model kind supports ``endpoint``, saying which endpoints it does support."""
        if endpoint not in self.endpoints:
            raise ServiceError(
                404,
                f"{endpoint} is not available: this server runs {DESCRIPTIONS[self.kind]}, which supports "
                f"{', '.join(ENDPOINTS[self.kind])} (and {', '.join(COMMON_ENDPOINTS)})",
                kind="not_found",
            )

    @property
    def context_length(self) -> int:
        return self.config.context_length

    def info(self) -> ModelInfo:
        c = self.config
        transformer = self.kind in TRANSLATORS
        return ModelInfo(
            name=self.name,
            kind=self.kind,
            description=DESCRIPTIONS[self.kind],
            path=str(self.bundle.path),
            parameters=sum(p.numel() for p in self.model.parameters()),
            layers=c.n_encoder_layers + c.n_decoder_layers if transformer else c.n_layers,
            encoder_layers=c.n_encoder_layers if transformer else None,
            decoder_layers=c.n_decoder_layers if transformer else None,
            heads=c.n_heads,
            d_model=c.d_model,
            context_length=self.context_length,
            vocab_size=c.src_vocab_size if transformer else c.vocab_size,
            target_vocab_size=c.tgt_vocab_size if transformer else None,
            tokenizer=getattr(self.tokenizer, "kind", type(self.tokenizer).__name__),
            endpoints=self.endpoints,
            limits={k: float(v) for k, v in asdict(self.limits).items()},
        )

    # ------------------------------------------------------------------------------------ checking

    def encode(self, text: str, what: str = "prompt", *, limit: int | None = None, target: bool = False) -> list[int]:
        """Token ids of ``text``, or 413 when it has more tokens than the server (or the model) accepts."""
        ids = (self.target_tokenizer if target else self.tokenizer).encode(text)
        limit = min(limit or self.limits.max_prompt_tokens, self.limits.max_prompt_tokens)
        if len(ids) > limit:
            flag = " (--max-prompt-tokens)" if limit == self.limits.max_prompt_tokens else " (the model's context)"
            raise ServiceError(
                413, f"the {what} has {len(ids)} tokens, more than the {limit} accepted{flag}: shorten it"
            )
        return ids

    def completion(self, request: CompletionRequest) -> Completion:
        """Check a completion request and prepare its generation (nothing runs until it is iterated)."""
        if request.max_tokens > self.limits.max_tokens:
            raise ServiceError(
                400,
                f"max_tokens={request.max_tokens} is more than this server allows ({self.limits.max_tokens}, "
                "--max-tokens): ask for fewer tokens",
            )
        return Completion(self, request, self.encode(request.prompt))

    # ---------------------------------------------------------------------------------- model work

    def _source(self, text: str) -> list[int]:
        ids = self.encode(text, "source sentence", limit=self.config.context_length)
        if not ids:
            raise ServiceError(400, "the source sentence has no tokens: give some text to translate")
        return ids

    @torch.inference_mode()
    def next_token(self, request: NextTokenRequest) -> NextTokenResponse:
        """The next-token distribution, with temperature, top-k and top-p applied as sampling applies them."""
        model, device = self.model, self.device
        if self.kind == "gpt":
            ids = self.encode(request.prompt) if request.prompt else []
            if not ids:
                ids = [self.tokenizer.bos_id] if self.tokenizer.bos_id is not None else self.tokenizer.encode("\n")
            ids = ids[-self.config.context_length :]  # what generation reads: the last C tokens
            logits = model(torch.tensor([ids], device=device), last_only=True)[0, -1]  # (V,)
        else:
            src = self._source(request.prompt)
            bos = self.target_tokenizer.bos_id
            target = self.encode(request.target, "target", limit=self.config.context_length - 1, target=True)
            memory = model.encode(torch.tensor([src], device=device))
            tgt = torch.tensor([[bos, *target]], device=device)
            logits = model.decode(tgt, memory, last_only=True)[0, -1]  # (V,)
            ids = src
        return distribution(logits.float(), request, self.target_tokenizer, len(ids))

    @torch.inference_mode()
    def attention(self, request: AttentionRequest) -> AttentionResponse:
        """Every layer's and head's attention weights for a text (see :mod:`qkv.server.attention`)."""
        if self.kind in TRANSLATORS:
            src = self._source(request.text)
            if request.target is None:
                target = attention.greedy_target(self.model, src, self.target_tokenizer)
            else:
                target = self.encode(request.target, "target", limit=self.config.context_length - 1, target=True)
            return attention.translator_maps(self, src, target, request.decimals)
        ids = self.encode(request.text, "text", limit=self.context_length)
        if self.kind == "encoder":
            tok = self.tokenizer
            ids = (
                ([tok.bos_id] if tok.bos_id is not None else [])
                + ids
                + ([tok.eos_id] if tok.eos_id is not None else [])
            )
            ids = ids[: self.context_length]
        return attention.self_maps(self, ids, request.decimals)

    @torch.inference_mode()
    def translate(self, request: TranslationRequest) -> TranslationResponse:
        """Translate the request's sentences (greedy, or beam search with ``beam`` > 1)."""
        texts = [request.text] if isinstance(request.text, str) else list(request.text)
        source_tokens = sum(len(self._source(text)) for text in texts)
        results = self.translator.translate_n_best(texts, beam=request.beam, n_best=1)
        outputs = [n_best[0][0] for n_best in results]
        target_tokens = sum(len(self.target_tokenizer.encode(text)) for text in outputs)
        return TranslationResponse(
            model=self.name,
            translations=[Translation(text=text, index=i) for i, text in enumerate(outputs)],
            usage=Usage(
                prompt_tokens=source_tokens, completion_tokens=target_tokens, total_tokens=source_tokens + target_tokens
            ),
        )


def distribution(
    logits: torch.Tensor, request: NextTokenRequest, tokenizer: Tokenizer, context: int
) -> NextTokenResponse:
    """The ``request.n`` likeliest next tokens of ``logits`` (V,): their probability at T = 1, and the one
    sampling would use, softmax(top_p(top_k(logits / T))) exactly as :func:`qkv.decoding.sample_next`."""
    raw = softmax(logits)  # (V,), T = 1, no filter
    if request.temperature == 0:
        probs = softmax(logits, 0)  # greedy: all the mass on the argmax
    else:
        scaled = (logits - logits.max()) / request.temperature
        probs = softmax(top_p_filter(top_k_filter(scaled, request.top_k or None), request.top_p))
    order = torch.argsort(logits, descending=True, stable=True)[: request.n]
    positive = probs[probs > 0]
    entropy = float(-(positive * positive.log2()).sum()) if positive.numel() else 0.0
    return NextTokenResponse(
        tokens=[
            TokenProbability(
                id=i,
                token=tokenizer.id_to_token(i),
                text=token_text(tokenizer, i),
                logit=_finite(float(logits[i])),
                prob=float(probs[i]),
                prob_t1=float(raw[i]),
            )
            for i in order.tolist()
        ],
        temperature=request.temperature,
        top_k=request.top_k,
        top_p=request.top_p,
        context_tokens=context,
        kept=int((probs > 0).sum()),
        entropy_bits=abs(entropy),
    )


def _finite(value: float) -> float:
    """JSON has no infinities: a masked logit is reported as a very negative number."""
    return value if math.isfinite(value) else -1e30
