"""The JSON the server reads and writes, as pydantic models: every request body is checked before any model
work starts, and a bad one is answered with 422 and a sentence naming the field.

The sampling fields mean what they mean everywhere in qkv (:mod:`qkv.decoding.sampling`): the next token is
drawn from softmax(filter(logits / T)); ``temperature`` 0 is greedy, ``top_k`` keeps the k likeliest tokens
(0 or null: all), ``top_p`` keeps the fewest likeliest tokens whose probabilities add up to p (1: all).
The completion request and response follow OpenAI's completions API, so its clients work unchanged.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Temperature = Field(1.0, ge=0.0, le=100.0, description="softmax(logits / T); 0 = greedy")
TopK = Field(None, ge=0, description="keep the k likeliest tokens; 0 or null keeps all")
TopP = Field(None, gt=0.0, le=1.0, description="keep the nucleus of probability mass p; 1 or null keeps all")
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes 64 bits
MAX_PROMPTS = 64
MAX_STOPS = 4  # as OpenAI


class _Request(BaseModel):
    """Unknown fields (``user``, ``stream_options``, ...) are ignored, not errors."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = Field(False, description="a last chunk with the usage and no choices")


class _Sampling(_Request):
    """How tokens are chosen (:class:`qkv.decoding.SamplingParams`, which the request builds once): the fields of
    OpenAI's API, and those vLLM adds (top_k, min_p, repetition_penalty, ignore_eos)."""

    temperature: float = Temperature
    top_p: float | None = TopP
    top_k: int | None = TopK
    min_p: float | None = Field(None, ge=0.0, le=1.0, description="keep tokens at least min_p times the likeliest")
    repetition_penalty: float = Field(1.0, gt=0.0, le=10.0, description="CTRL's penalty on tokens in the text; 1: none")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="minus this once per generated token")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="minus this per earlier occurrence")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="same seed and settings, same text")
    stop: str | list[str] | None = Field(None, description="up to 4 strings that end a completion (left out)")
    n: int = Field(1, ge=1, description="completions per prompt")
    stream: bool = Field(False, description="send tokens as server-sent events while they are made")
    stream_options: StreamOptions | None = Field(None, description="with stream: include_usage")
    logit_bias: dict[str, float] | None = Field(None, description="not supported")
    ignore_eos: bool = Field(False, description="keep going after <eos> (exactly max_tokens tokens, for benchmarks)")
    model: str | None = Field(None, description="the served model's id (GET /v1/models); null: that one")

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else (value or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop string is empty: give the text that should end a completion")
        return value


class CompletionRequest(_Sampling):
    """POST /v1/completions: continue ``prompt`` (OpenAI's completions API).

    ``prompt`` is a text, a list of texts, a list of token ids or a list of such lists; each prompt gets
    ``n`` choices, numbered prompt_index * n + j as OpenAI numbers them.
    """

    prompt: str | list[str] | list[int] | list[list[int]] = Field(..., description="the text(s) to continue")
    max_tokens: int = Field(16, ge=0, description="tokens to generate at most per choice (0: score the prompt)")
    logprobs: int | None = Field(None, ge=0, description="log-probabilities of the chosen and the top-N tokens")
    echo: bool = Field(False, description="put the prompt (and its logprobs) in front of the completion")
    suffix: str | None = Field(None, description="not supported: qkv's models only continue text")
    best_of: int | None = Field(None, ge=1, description="not supported beyond 1")

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value):
        if isinstance(value, str):
            if not value:
                raise ValueError("the prompt is empty: give some text to continue")
            return value
        if not value:
            raise ValueError("give at least one prompt")
        if len(value) > MAX_PROMPTS and not all(isinstance(x, int) for x in value):
            raise ValueError(f"at most {MAX_PROMPTS} prompts per request, got {len(value)}: split the list")
        if any((isinstance(x, str | list) and len(x) == 0) for x in value):
            raise ValueError("a prompt in the list is empty: give some text (or token ids) in each")
        return value


class ChatMessage(_Request):
    """One message of a conversation: its role and its content (a text, or OpenAI's list of text parts)."""

    role: str
    content: str | list[dict] | None = None


class ChatCompletionRequest(_Sampling):
    """POST /v1/chat/completions: answer a conversation (OpenAI's chat completions API), rendered with the model's
    chat template; the answer ends at the template's end of turn."""

    messages: list[ChatMessage] = Field(..., min_length=1, description="the conversation so far")
    max_tokens: int | None = Field(None, ge=0, description="deprecated by OpenAI: max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=0, description="tokens to generate at most per choice")
    logprobs: bool = Field(False, description="the log-probability of each generated token")
    top_logprobs: int | None = Field(None, ge=0, le=20, description="and this many top alternatives (needs logprobs)")
    tools: list[dict] | None = Field(
        None, description="function schemas the template shows the model (answers are text)"
    )
    tool_choice: str | dict | None = Field(None, description="only 'none' or 'auto': qkv does not parse tool calls")
    response_format: dict | None = Field(None, description="only {'type': 'text'}")


class Logprobs(BaseModel):
    """OpenAI's logprobs of one choice: per token, its text, its log-probability (null for the first prompt
    token under ``echo``), the top alternatives {text: logprob} and its character offset in prompt + text."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int = 0
    logprobs: Logprobs | None = None
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


class TokenizeRequest(_Request):
    """POST /tokenize: the token ids of ``prompt`` (vLLM's shape)."""

    prompt: str = Field(..., description="the text to tokenize")
    model: str | None = None
    target: bool = Field(False, description="translators: use the target language's tokenizer")
    return_token_strs: bool = Field(False, description="also return each token's vocabulary entry")


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    """POST /detokenize: the text of token ids."""

    tokens: list[int] = Field(..., description="token ids")
    model: str | None = None
    target: bool = Field(False, description="translators: use the target language's tokenizer")


class DetokenizeResponse(BaseModel):
    prompt: str


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
        if len(texts) > MAX_PROMPTS:
            raise ValueError(f"at most {MAX_PROMPTS} sentences per request, got {len(texts)}: split the list")
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
    label: str  # how qkv shows it (whitespace made visible: "␣" for a space token), as `qkv next` does
    logit: float
    prob: float  # with the temperature, top-k and top-p applied: what sampling would draw from
    prob_t1: float  # softmax(logits) at T = 1 with no filter: the model's own distribution


class NextTokenResponse(BaseModel):
    tokens: list[TokenProbability]
    temperature: float
    top_k: int | None
    top_p: float | None
    context_tokens: int  # tokens the model read
    cropped: int  # prompt tokens before the context window, not read
    kept: int  # tokens with a probability above 0 after the filters
    entropy_bits: float  # entropy of the sampled distribution


class AttentionRequest(_Request):
    """POST /v1/attention: every layer's and head's attention weights for ``text``.

    For a translator, ``text`` is the source and ``target`` the translation (default: the model's greedy one).
    """

    text: str = Field(..., min_length=1)
    target: str | None = None
    decimals: int = Field(4, ge=1, le=8, description="weights are rounded to keep the JSON small")


class WalkthroughRequest(_Request):
    """POST /v1/walkthrough: a GPT's whole forward pass on ``text`` (:func:`qkv.inspect.walkthrough`)."""

    text: str = Field(..., min_length=1)
    top: int = Field(5, ge=1, le=20, description="logit-lens tokens kept per block and position")
    decimals: int = Field(4, ge=1, le=8, description="numbers are rounded to keep the JSON small")
    logits: bool = Field(False, description="also send the last position's logits and every vocabulary label")


class AttentionGroup(BaseModel):
    """The weights of one kind of attention: ``weights[layer][head][query][key]``, each row summing to 1."""

    title: str
    description: str  # one sentence for the playground: who looks at whom
    causal: bool
    query_tokens: list[str]  # the rows' labels
    key_tokens: list[str]  # the columns' labels
    weights: list[list[list[list[float]]]]


class AttentionResponse(BaseModel):
    """The numbers `qkv attention --json` prints for the same text (:meth:`qkv.inspect.AttentionMaps.to_dict`),
    one group per kind of attention: "decoder" (a GPT), "encoder" (an encoder), or "encoder", "decoder" and
    "cross" (a translator, run on <bos> + the target)."""

    kind: str
    source_tokens: list[str]
    target_tokens: list[str] | None = None  # translators: the decoder's inputs, <bos> first
    generated: bool = False  # translators: the target is the model's own greedy translation
    target_text: str | None = None
    groups: dict[str, AttentionGroup]


class ModelInfo(BaseModel):
    """GET /v1/model. ``kind`` is the model's family ("gpt", "llama", ...), ``role`` what it is for ("language
    model", "encoder", "translator"); ``unavailable`` gives, for each model endpoint the family lacks, the one
    line that refuses it; ``chat_template`` says whether /v1/chat/completions has a template to render with (the
    model's own, or ``qkv serve --chat-template``'s)."""

    name: str
    kind: str
    role: str
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
    capabilities: list[str]
    endpoints: list[str]
    unavailable: dict[str, str]
    limits: dict[str, float]
    chat_template: bool = False
