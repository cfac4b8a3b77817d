"""A loaded model and what serves it: its limits, its family's endpoints, the model thread, the schedulers.

The server is a ladder whose arrows point one way: the app (:mod:`qkv.server.app`) mounts the routes
(:mod:`qkv.server.routes`), which check a request, hand model work to the analysis views
(:mod:`qkv.server.analyses`) or to a completion's scheduler (:mod:`qkv.server.scheduler`, over the decoding
engine), and make text of what comes back (:mod:`qkv.server.output`). This :class:`Service` holds what they share:
the bundle, the limits, the metrics, the one model thread every forward pass runs on
(:mod:`qkv.server.model_thread`), the gates that bound concurrent work, the completion scheduler and the
translation batches. One model serves every request at once, which is safe because nothing a request does changes
it: the model stays in eval mode, every forward pass runs without gradients, activations are captured per
context, and each request gets its own rows of the KV cache and its own ``torch.Generator``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import cast

import torch

from qkv.chat_templates import ChatTemplate
from qkv.decoding.translator import Translator
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.models.family import LANGUAGE_MODEL, TRANSLATOR, Family, family_of
from qkv.server.analyses import encode_checked
from qkv.server.config_shape import DecoderConfig, ServedConfig, TranslatorConfig
from qkv.server.errors import ServiceError
from qkv.server.limits import Gate, Limits
from qkv.server.metrics import Metrics
from qkv.server.model_thread import ModelThread
from qkv.server.pool import make_scheduler
from qkv.server.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    ModelInfo,
    TokenizeRequest,
    TokenizeResponse,
    Translation,
    TranslationRequest,
    TranslationResponse,
    Usage,
)
from qkv.server.translation_batches import TranslationBatches


def _attention(family: Family) -> None:
    """Attention weights to show: self-attention heads, or RNNSearch's alignment (its one additive attention)."""
    if not family.has("alignment"):
        family.require("self-attention heads", "tracing attention")


# What each model endpoint needs from the model's family (qkv.models.family). A family that lacks it gets
# the family's one line, the same the command line gives for the same view ("the walk-through", ...).
NEEDS: dict[str, Callable[[Family], None]] = {
    "/v1/completions": lambda family: family.require_role(LANGUAGE_MODEL, "/v1/completions"),
    "/v1/chat/completions": lambda family: family.require_role(LANGUAGE_MODEL, "/v1/chat/completions"),
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


class Service:
    """A loaded model and the limits it is served under."""

    def __init__(
        self,
        bundle: ModelBundle,
        limits: Limits | None = None,
        *,
        name: str | None = None,
        scheduler: str = "batched",
        step: str = "auto",
        chat_template: ChatTemplate | None = None,
    ) -> None:
        self.bundle = bundle
        self.chat_template = chat_template  # --chat-template; None: the model's own (qkv.chat_templates)
        self.model = bundle.model.eval()
        self.config = cast(ServedConfig, bundle.config)  # a Transformer's or RNNSearch's (NEEDS refuses the rest)
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
        self.step = step
        self.metrics = Metrics()
        self.model_thread = ModelThread()  # every forward pass runs there (qkv.server.model_thread)
        self.scheduler = None
        if "/v1/completions" not in self.refused:
            self.scheduler = make_scheduler(scheduler, self.model, self.limits, self.generations, self.metrics,
                                            self.model_thread, step)  # fmt: skip
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
        translator = cast(TranslatorConfig, c)
        stacks = (translator.n_encoder_layers, translator.n_decoder_layers) if two else None
        return ModelInfo(
            name=self.name,
            kind=self.kind,
            role=family.role,
            description=family.title,
            path=str(self.bundle.path),
            parameters=sum(p.numel() for p in self.model.parameters()),
            layers=stacks[0] + stacks[1] if stacks else cast(DecoderConfig, c).n_layers,
            encoder_layers=stacks[0] if stacks else None,
            decoder_layers=stacks[1] if stacks else None,
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
            chat_template=self.chat_template is not None or bool(self.bundle.chat_template),
        )

    # ---------------------------------------------------------------------------------- translations

    def check_translation(self, request: TranslationRequest) -> tuple[list[str], int]:
        """The request's sentences and their number of source tokens, or the error that refuses it."""
        texts = [request.text] if isinstance(request.text, str) else list(request.text)
        source_tokens = 0
        for text in texts:
            ids = encode_checked(self.tokenizer, text, self.limits, "source sentence")
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
        assert self.translator is not None  # the translations route is refused to other families
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
