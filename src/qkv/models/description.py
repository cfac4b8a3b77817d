"""What a model family's description says: the :class:`Family` each family's folder fills in.

A family is everything the rest of the package needs to know about a kind of model: its config class
(whose ``kind`` is saved in config.json), how it is built, which tokenizers it has (one vocabulary, or a
source and a target), what it offers to the views, which fast decode step may run it, its presets and
training defaults, and how its Hugging Face checkpoints are converted. The command line, the server,
training and :mod:`qkv.inspect` ask a description ("does this model have a residual stream?", "which
command uses it?") instead of testing kinds, and a view a family lacks is refused from the description with
the same one line everywhere (:meth:`Family.require`)::

    family = family_of(model)                  # a model, a config, or a kind name
    family.require("residual stream", "the logit lens")
    family.streams["decoder"]                  # ("embedding", "decoder"): W_E's module and the stack it feeds

Each family's folder writes its own description (``qkv/models/gpt/family.py``, ...); the table of them,
:mod:`qkv.models.family`, is the one place that lists the families. :mod:`qkv.models.llama` is the checklist
for adding one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.models.config import ModelConfig
from qkv.tokenizers import Tokenizer

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

DECODE_STEPS = ("causal", "cross", "one-pass")
"""The fast steps of :mod:`qkv.decoding` a family may declare (:attr:`Family.decode_step`): "causal" (one token
of a decoder-only stack over a static KV cache), "cross" (the same with cross-attention to an encoder's keys and
values), "one-pass" (an encoder: one pass over whole sequences, no cache)."""


@dataclass(frozen=True)
class LoRATarget:
    """A projection LoRA may adapt (:mod:`qkv.models.lora`), under the name PEFT's ``target_modules`` gives it.

    ``modules``: the qkv modules it is, ``{i}`` standing for the block (several: one adapter over projections
    that read the same input, sharing A, as GPT-2's fused ``c_attn`` is W_q, W_k and W_v); ``peft``: the module's
    path in the Hugging Face model, which PEFT's adapter keys carry (``model.layers.{i}.self_attn.q_proj``);
    ``transposed``: Hugging Face stores that matrix as (d_in, d_out) (GPT-2's Conv1D: PEFT's ``fan_in_fan_out``)."""

    modules: tuple[str, ...]
    peft: str
    transposed: bool = False


class HFConversion(Protocol):
    """What a family's Hugging Face module offers the loader (:func:`qkv.pretrained.load_pretrained`): the
    config, the weights and the tokenizer(s) of a Hugging Face folder as qkv's."""

    def config_from_hf(self, hf_config: dict[str, Any]) -> ModelConfig: ...

    def convert(self, hf_state_dict: dict[str, Tensor], hf_config: dict[str, Any]) -> nn.Module: ...

    def load_tokenizers(self, folder: Path, hf_config: dict[str, Any]) -> tuple[Tokenizer, Tokenizer | None]: ...


class GGUFConversion(Protocol):
    """What a family's GGUF module offers (:func:`qkv.pretrained.gguf.load_gguf`, :func:`qkv.export.gguf.export_gguf`):
    the llama.cpp ``ARCHITECTURES`` it reads and writes, the tensor names it leaves out (``IGNORED``), the config
    from a file's metadata, the name table of an architecture, the metadata of a config, and what a model becomes
    (its architecture, config, tensors by qkv name and extra tensors)."""

    ARCHITECTURES: tuple[str, ...]
    IGNORED: tuple[str, ...]

    def config_from_gguf(self, meta: Any, file: Any) -> ModelConfig: ...

    def rows(self, config: Any, arch: str) -> list[Any]: ...

    def metadata(self, config: Any, arch: str) -> dict[str, object]: ...

    def export(self, model: nn.Module, *, approximate_gelu: bool = False) -> tuple[str, Any, dict, dict]: ...


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
    # What the first block reads, for a config (None: "the embeddings"), as the views say it.
    embedding_note: Callable[[Any], str | None] | None = None
    streams: dict[str, tuple[str, str]] = field(default_factory=dict)
    # The streams whose blocks are decoder blocks: self-attention under a causal mask (then cross-attention, in a
    # family that has it); the others' blocks attend both ways (an encoder's).
    masked: frozenset[str] = frozenset()
    output: str | None = None
    embedding: str | None = None  # the module holding W_E (its ``weight`` rows are the token vectors)
    target_embedding: str | None = None  # a translator's target-side W_E (None: one vocabulary)
    unembedding: str | None = None  # the module holding W_U, where the family has the "unembedding" capability
    # The fast decode step of qkv.decoding that may run it (one of DECODE_STEPS); None: the model's own forward.
    decode_step: str | None = None
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)  # named sizes: preset -> config fields
    # What `qkv train --arch NAME` starts from when no --preset is given: its preset and the recipe it trains
    # best with (on top of the task's defaults, qkv.training.config.TASK_DEFAULTS).
    train_defaults: dict[str, Any] = field(default_factory=dict)
    summary: Callable[[Any], str] | None = None  # one line naming the architecture and its sizes (describe)
    hf_architectures: tuple[str, ...] = ()  # Hugging Face ``architectures`` it imports (qkv.pretrained)
    hf_model_types: tuple[str, ...] = ()  # config.json's ``model_type`` values it converts
    hf_conversion: HFConversion | None = None  # the folder's Hugging Face module (None: no import)
    gguf: GGUFConversion | None = None  # the folder's GGUF module: llama.cpp's files in and out (None: neither)
    # The projections `qkv train --lora` may adapt, by their PEFT names, and those it adapts by default (PEFT's).
    lora_targets: dict[str, LoRATarget] = field(default_factory=dict)
    lora_default: tuple[str, ...] = ()
    # What a config says of its model's positions and norms, for the checks and views that read a text: the
    # positions it attends over; how positions enter ("rope", "learned", "sinusoidal", "none"); the norm each
    # block applies to its input ("LayerNorm", "RMSNorm"; None when post-LN). None: the family has no such thing.
    context: Callable[[Any], int] | None = None
    width: Callable[[Any], int] = lambda config: config.d_model  # the vectors it passes (the paper's d_model)
    positional: Callable[[Any], str] | None = None
    input_norm: Callable[[Any], str | None] | None = None
    # The config fields that count each stack's blocks ("n_layers"; a translator's "n_encoder_layers" and
    # "n_decoder_layers"), and the one counting the blocks that keep a KV cache as it generates (None: no cache).
    layer_fields: tuple[str, ...] = ()
    cached_layers: str | None = None

    def __post_init__(self) -> None:
        if self.decode_step not in (None, *DECODE_STEPS):
            raise ValueError(f"decode_step={self.decode_step!r}: one of {', '.join(DECODE_STEPS)} or None")
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r}: one of {', '.join(ROLES)}")
        if self.cached_layers is not None and self.cached_layers not in self.layer_fields:
            raise ValueError(f"cached_layers={self.cached_layers!r}: one of layer_fields {self.layer_fields}")
        if bool(self.hf_model_types) != (self.hf_conversion is not None):
            raise ValueError("a family that imports Hugging Face model types needs its conversion, and only then")

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

    def context_length(self, config: Any) -> int | None:
        """The positions a model of ``config`` attends over; None for a family without a context (Word2Vec)."""
        return self.context(config) if self.context is not None else None

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The blocks of each stack the family names (its ``streams``: encoder, then decoder), in order; none for a
        family without block stacks (RNNSearch's GRUs, Word2Vec)."""
        stacks = [model.get_submodule(stack) for _, stack in self.streams.values()]
        return [block for stack in stacks for block in getattr(stack, "blocks", ())]

    def model_width(self, config: Any) -> int:
        """The width of the vectors a model of ``config`` passes from layer to layer: d_model, or RNNSearch's GRU
        state (the paper's learning-rate schedule scales by its inverse square root)."""
        return self.width(config)

    def positions(self, config: Any) -> str:
        """How positions enter a model of ``config``: "rope", "learned", "sinusoidal", or "none" (its GRUs read the
        tokens in order, or it reads no sequence)."""
        return self.positional(config) if self.positional is not None else "none"

    def block_input_norm(self, config: Any) -> str | None:
        """The norm each block of a model of ``config`` applies to its input before attention ("LayerNorm" in
        GPT-2's pre-LN, "RMSNorm" in Llama's); None when blocks normalise their output (the paper's post-LN) or
        the family has no such blocks."""
        return self.input_norm(config) if self.input_norm is not None else None

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

    def describe(self, config: Any) -> str:
        """One line naming the architecture of ``config`` and its sizes (the summary printed before training)."""
        return self.summary(config) if self.summary is not None else self.title

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
