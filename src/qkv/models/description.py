"""One description per model family: the one place in qkv that knows the families by name.

A family is everything the rest of the package needs to know about a kind of model: its config class
(whose ``kind`` is saved in config.json), how it is built, which tokenizers it has (one vocabulary, or a
source and a target), and what it offers to the views. The command line, the server and :mod:`qkv.inspect`
ask a description ("does this model have a residual stream?", "which command uses it?") instead of testing
kinds, and a view a family lacks is refused from the description with the same one line everywhere
(:meth:`Family.require`)::

    family = family_of(model)                  # a model, a config, or a kind name
    family.require("residual stream", "the logit lens")
    family.streams["decoder"]                  # ("embedding", "decoder"): W_E's module and the stack it feeds

Adding a family means adding one :class:`Family` to :data:`FAMILIES` (and its config class in
:mod:`qkv.models.config`); docs/architecture.md walks through the Llama family as the worked example.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from qkv.errors import QkvError
from qkv.models.config import (
    EncoderConfig,
    GPTConfig,
    LlamaConfig,
    ModelConfig,
    RNNSearchConfig,
    TransformerConfig,
    Word2VecConfig,
)
from qkv.storage import unwrap_model

LANGUAGE_MODEL, ENCODER, TRANSLATOR, WORD_VECTORS = "language model", "encoder", "translator", "word vectors"
ROLES = (LANGUAGE_MODEL, ENCODER, TRANSLATOR, WORD_VECTORS)
"""What a model is for; each role has one command that uses it (:data:`COMMANDS`)."""

COMMANDS = {LANGUAGE_MODEL: "qkv generate", ENCODER: "qkv embed", TRANSLATOR: "qkv translate",
            WORD_VECTORS: "qkv embeddings"}  # fmt: skip

CAPABILITIES = (
    "residual stream",  # a stack of residual blocks whose stream can be read, patched and attributed
    "self-attention heads",  # multi-head self-attention in some stack
    "cross-attention",  # a decoder that attends to an encoder's output through heads
    "alignment",  # an additive alignment (RNNSearch): one weight per source position per target token
    "embeddings",  # W_E: one vector per token
    "positions",  # a position table or rotary angles
    "unembedding",  # W_U: the last vector -> next-token logits
)


@dataclass(frozen=True)
class Family:
    """A kind of model and what it offers. ``streams`` maps each stack with a residual stream to the module
    that embeds its input and the stack's own module (``{"decoder": ("embedding", "decoder")}`` for a GPT);
    ``output`` names the stream that ends in W_U (None when none does)."""

    name: str  # the config's kind, saved in config.json: "gpt", "llama", ...
    config: type[ModelConfig]
    model: type[nn.Module]
    title: str  # how messages name it: "a GPT language model (decoder only)"
    role: str  # one of ROLES
    capabilities: frozenset[str]
    instead: str  # what to use for a view this family lacks (the end of the refusal line)
    # One sentence per kind of attention the views draw ("encoder", "decoder", "cross"): what its weights mean.
    attention_notes: dict[str, str] = field(default_factory=dict)
    streams: dict[str, tuple[str, str]] = field(default_factory=dict)
    output: str | None = None
    embedding: str | None = None  # the module holding W_E (its ``weight`` rows are the token vectors)
    target_embedding: str | None = None  # a translator's target-side W_E (None: one vocabulary)
    hf_architectures: tuple[str, ...] = ()  # Hugging Face ``architectures`` it imports (qkv.pretrained)

    @property
    def two_vocabularies(self) -> bool:
        """A source and a target tokenizer (translators), or one."""
        return self.role == TRANSLATOR

    @property
    def command(self) -> str:
        """The verb that uses this family's models: ``qkv generate`` for a language model, ..."""
        return COMMANDS[self.role]

    @property
    def vocab_fields(self) -> tuple[str, ...]:
        """The config fields that the tokenizer(s) size: ("vocab_size",) or ("src_vocab_size", "tgt_vocab_size")."""
        return ("src_vocab_size", "tgt_vocab_size") if self.two_vocabularies else ("vocab_size",)

    @property
    def self_attention_parts(self) -> tuple[str, ...]:
        """The stacks whose self-attention heads the views show, in the order they run."""
        if "self-attention heads" not in self.capabilities:
            return ()
        return tuple(self.streams)

    def side(self, part: str) -> str:
        """The token stream that ``part``'s positions are: "target" for a translator's decoder, which reads
        the translation written so far, else "source" (a translator's encoder, or the one text of the rest)."""
        return "target" if self.two_vocabularies and part == "decoder" else "source"

    def has(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}: one of {', '.join(CAPABILITIES)}")
        return capability in self.capabilities

    def require(self, capability: str, view: str) -> None:
        """Nothing if this family has ``capability``; else the one line every verb and endpoint gives."""
        if not self.has(capability):
            raise QkvError(refusal(self, capability, view))

    def require_role(self, role: str, what: str) -> None:
        """QkvError unless this family's models are ``role`` ("translator", ...): ``what`` needs one."""
        if self.role != role:
            raise QkvError(f"{what} needs {_article(role)}, and this is {self.title}: use `{self.command}` with it")


def refusal(family: Family, capability: str, view: str) -> str:
    """The line that refuses ``view`` on a family that lacks ``capability``."""
    return f"{view} needs {_article(capability)}, and {family.title} has none: {family.instead}"


def _article(noun: str) -> str:
    if noun.endswith("s") and not noun.endswith("ss"):
        return noun  # "self-attention heads", "embeddings", "word vectors"
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def _transformer_families() -> list[Family]:
    from qkv.models.encoder import Encoder
    from qkv.models.gpt import GPT
    from qkv.models.llama import Llama
    from qkv.models.transformer import Transformer

    decoder_only = frozenset({"residual stream", "self-attention heads", "embeddings", "positions", "unembedding"})
    causal = {"decoder": "causal self-attention: each token looks at itself and the tokens before it"}
    gpt = Family(
        name="gpt",
        config=GPTConfig,
        model=GPT,
        title="a GPT language model (decoder only)",
        role=LANGUAGE_MODEL,
        capabilities=decoder_only,
        attention_notes=causal,
        instead="use a translator for cross-attention",
        streams={"decoder": ("embedding", "decoder")},
        output="decoder",
        embedding="embedding.token_embedding",
        hf_architectures=("GPT2LMHeadModel",),
    )
    llama = replace(  # GPT's flow and views; what differs is in its config's layers (models/llama.py)
        gpt,
        name="llama",
        config=LlamaConfig,
        model=Llama,
        title="a Llama-style language model (decoder only: RMSNorm, SwiGLU, grouped-query attention, RoPE)",
        hf_architectures=("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM"),
    )
    encoder = Family(
        name="encoder",
        config=EncoderConfig,
        model=Encoder,
        title="an encoder (BERT family)",
        role=ENCODER,
        capabilities=frozenset({"residual stream", "self-attention heads", "embeddings", "positions"}),
        attention_notes={"encoder": "self-attention: each token looks at every token of the text"},
        instead="an encoder has no W_U (qkv imports BERT without its masked-LM head); use a GPT or a "
        "translator, or `qkv heads` and `qkv attention` for an encoder",
        streams={"encoder": ("embedding", "encoder")},
        embedding="embedding.token_embedding",
        hf_architectures=("BertModel", "BertForMaskedLM"),
    )
    transformer = Family(
        name="transformer",
        config=TransformerConfig,
        model=Transformer,
        title="an encoder-decoder translator",
        role=TRANSLATOR,
        capabilities=decoder_only | {"cross-attention"},
        attention_notes={
            "encoder": "encoder self-attention: each source token looks at every source token",
            "decoder": "decoder masked self-attention: each target position looks at itself and the ones before",
            "cross": "cross-attention: while writing each target token, where the decoder looks in the source",
        },
        instead="use `qkv translate`",
        streams={"encoder": ("src_embedding", "encoder"), "decoder": ("tgt_embedding", "decoder")},
        output="decoder",
        embedding="src_embedding.token_embedding",
        target_embedding="tgt_embedding.token_embedding",
        hf_architectures=("MarianMTModel",),
    )
    return [gpt, llama, encoder, transformer]


def _predecessor_families() -> list[Family]:
    from qkv.models.rnnsearch import RNNSearch
    from qkv.models.word2vec import Word2Vec

    rnnsearch = Family(
        name="rnnsearch",
        config=RNNSearchConfig,
        model=RNNSearch,
        title="RNNSearch (GRUs and one additive alignment, no Transformer blocks)",
        role=TRANSLATOR,
        capabilities=frozenset({"alignment", "embeddings", "unembedding"}),
        attention_notes={
            "cross": "additive attention: while writing each target token, where the decoder's state looks in "
            "the source (the alignment of Bahdanau et al. 2015)"
        },
        instead="use `qkv attention` for its alignment or `qkv next` for its predictions, or a Transformer translator",
        embedding="src_embedding.token_embedding",
        target_embedding="tgt_embedding.token_embedding",
    )
    word2vec = Family(
        name="word2vec",
        config=Word2VecConfig,
        model=Word2Vec,
        title="Word2Vec (one matrix of word vectors, no Transformer)",
        role=WORD_VECTORS,
        capabilities=frozenset({"embeddings"}),
        instead="use `qkv embeddings`",
        embedding="token_embedding",
    )
    return [rnnsearch, word2vec]


def _families() -> dict[str, Family]:
    return {family.name: family for family in _transformer_families() + _predecessor_families()}


_FAMILIES: dict[str, Family] = {}


def families() -> dict[str, Family]:
    """Every family by name ("gpt", "llama", "encoder", "transformer", "rnnsearch", "word2vec")."""
    if not _FAMILIES:  # built on first use: the model modules import the layers, which must not import this
        _FAMILIES.update(_families())
    return _FAMILIES


def family_of(thing: Any) -> Family:
    """The family of a model (also inside DDP or torch.compile), a config, or a kind name ("gpt")."""
    if isinstance(thing, str):
        kind = thing
    else:
        config = thing if isinstance(thing, ModelConfig) else getattr(unwrap_model(thing), "config", None)
        kind = getattr(config, "kind", None)
    table = families()
    if kind not in table:
        raise QkvError(f"unknown model kind {kind!r}: qkv knows {', '.join(table)}")
    return table[kind]  # type: ignore[index]


def build_model(config: ModelConfig) -> nn.Module:
    """The model a config describes, freshly initialised: GPTConfig -> GPT, LlamaConfig -> Llama, ..."""
    if not isinstance(config, ModelConfig):
        raise QkvError(f"cannot build a model from a {type(config).__name__}: give one of qkv's model configs")
    return family_of(config).model(config)
