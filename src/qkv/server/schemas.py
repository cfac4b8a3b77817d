"""The JSON the server reads and writes, as pydantic models: every request body is checked before any model
work starts, and a bad one is answered with 422 and a sentence naming the field.

The sampling fields mean what they mean everywhere in qkv (:mod:`qkv.decoding.sampling`): the next token is
drawn from softmax(filter(logits / T)); ``temperature`` 0 is greedy, ``top_k`` keeps the k likeliest tokens
(0 or null: all), ``top_p`` keeps the fewest likeliest tokens whose probabilities add up to p (1: all).
The completion request and response follow the OpenAI completions API, so its clients work unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Temperature = Field(1.0, ge=0.0, le=100.0, description="softmax(logits / T); 0 = greedy")
TopK = Field(None, ge=0, description="keep the k likeliest tokens; 0 or null keeps all")
TopP = Field(None, gt=0.0, le=1.0, description="keep the nucleus of probability mass p; 1 or null keeps all")


class _Request(BaseModel):
    """Unknown fields (an OpenAI client sends ``n``, ``logprobs``, ...) are ignored, not errors."""

    model_config = ConfigDict(extra="ignore")


class CompletionRequest(_Request):
    """POST /v1/completions: continue ``prompt`` (OpenAI's shape; one prompt per request)."""

    prompt: str = Field(..., min_length=1, description="the text to continue")
    model: str | None = Field(None, description="ignored: the server runs one model")
    max_tokens: int = Field(16, ge=0, description="tokens to generate at most")
    temperature: float = Temperature
    top_p: float | None = TopP
    top_k: int | None = TopK
    seed: int | None = Field(None, ge=0, description="same seed and settings, same text")
    stream: bool = Field(False, description="send tokens as server-sent events while they are made")
    ignore_eos: bool = Field(False, description="keep going after <eos> (exactly max_tokens tokens, for benchmarks)")


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: Literal["stop", "length"] | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    """The OpenAI completion object; one chunk of a stream has the same shape without ``usage``."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TranslationRequest(_Request):
    """POST /v1/translations: translate one sentence, or a list of sentences, with the encoder-decoder."""

    text: str | list[str] = Field(..., description="a source sentence or a list of them")
    beam: int = Field(1, ge=1, le=16, description="beam size; 1 = greedy")

    @field_validator("text")
    @classmethod
    def _not_empty(cls, value: str | list[str]) -> str | list[str]:
        texts = [value] if isinstance(value, str) else value
        if not texts:
            raise ValueError("give at least one sentence to translate")
        if len(texts) > 64:
            raise ValueError(f"at most 64 sentences per request, got {len(texts)}: split the list")
        if any(not t.strip() for t in texts):
            raise ValueError("a sentence to translate is empty: give some text")
        return value


class Translation(BaseModel):
    text: str
    index: int


class TranslationResponse(BaseModel):
    object: Literal["translation"] = "translation"
    model: str
    translations: list[Translation]
    usage: Usage


class NextTokenRequest(_Request):
    """POST /v1/next-token: the next-token distribution after ``prompt``, as sampling would use it.

    For a translator, ``prompt`` is the source sentence and ``target`` the start of its translation; the
    distribution is over the next target token.
    """

    prompt: str = Field("", description="the text so far (a GPT) or the source sentence (a translator)")
    target: str = Field("", description="translators: the translation written so far")
    temperature: float = Temperature
    top_k: int | None = TopK
    top_p: float | None = TopP
    n: int = Field(10, ge=1, le=500, description="how many of the likeliest tokens to return")


class TokenProbability(BaseModel):
    id: int
    token: str  # the vocabulary entry, as stored ("Ġquick" for byte-level BPE)
    text: str  # what it decodes to (" quick")
    logit: float
    prob: float  # with the temperature, top-k and top-p applied: what sampling would draw from
    prob_t1: float  # softmax(logits) at T = 1 with no filter: the model's own distribution


class NextTokenResponse(BaseModel):
    tokens: list[TokenProbability]
    temperature: float
    top_k: int | None
    top_p: float | None
    context_tokens: int  # tokens the model read
    kept: int  # tokens with a probability above 0 after the filters
    entropy_bits: float  # entropy of the sampled distribution


class AttentionRequest(_Request):
    """POST /v1/attention: every layer's and head's attention weights for ``text``.

    For a translator, ``text`` is the source and ``target`` the translation (default: the model's greedy one).
    """

    text: str = Field(..., min_length=1)
    target: str | None = None
    decimals: int = Field(4, ge=1, le=8, description="weights are rounded to keep the JSON small")


class AttentionMap(BaseModel):
    """The weights of one kind of attention: ``weights[layer][head][query][key]``, each row summing to 1."""

    name: Literal["self", "encoder", "decoder", "cross"]
    description: str
    queries: Literal["tokens", "target_tokens"]  # which token list labels the rows
    keys: Literal["tokens", "target_tokens"]  # and which the columns
    weights: list[list[list[list[float]]]]


class AttentionResponse(BaseModel):
    kind: str
    tokens: list[str]  # the text's (or source's) tokens, as text
    target_tokens: list[str] | None = None  # translators: the decoder's inputs, <bos> first
    predicted_tokens: list[str] | None = None  # translators: what each decoder position predicts, <eos> last
    target_text: str | None = None
    maps: list[AttentionMap]


class ModelInfo(BaseModel):
    name: str
    kind: str
    description: str
    path: str
    parameters: int
    layers: int
    encoder_layers: int | None = None
    decoder_layers: int | None = None
    heads: int
    d_model: int
    context_length: int
    vocab_size: int
    target_vocab_size: int | None = None
    tokenizer: str
    endpoints: list[str]
    limits: dict[str, float]
