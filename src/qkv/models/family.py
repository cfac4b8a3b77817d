"""The table of model families: the one place in qkv that lists them.

Each family lives in its own folder (``qkv/models/gpt/``, ...) and describes itself there in ``family.py``
(a :class:`~qkv.models.description.Family`); this module gathers those descriptions, in the order the
command line lists them, and answers "which family is this model?"::

    family = family_of(model)                  # a model, a config, or a kind name
    family.require("residual stream", "the logit lens")
    family.streams["decoder"]                  # ("embedding", "decoder"): W_E's module and the stack it feeds

The rest of qkv (the verbs, the server, :mod:`qkv.inspect`, training, decoding, the Hugging Face loader)
asks a description what a model can do instead of testing its kind. :mod:`qkv.models.llama` is the
checklist for adding a family.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from torch import nn

from qkv.errors import QkvError
from qkv.models.config import ModelConfig
from qkv.models.description import (
    CAPABILITIES,
    COMMANDS,
    DECODE_STEPS,
    ENCODER,
    LANGUAGE_MODEL,
    ROLES,
    TRANSLATOR,
    WORD_VECTORS,
    Family,
    HFConversion,
    refusal,
)
from qkv.models.encoder.family import FAMILY as ENCODER_FAMILY
from qkv.models.gpt.family import FAMILY as GPT_FAMILY
from qkv.models.llama.family import FAMILY as LLAMA_FAMILY
from qkv.models.rnnsearch.family import FAMILY as RNNSEARCH_FAMILY
from qkv.models.transformer.family import FAMILY as TRANSFORMER_FAMILY
from qkv.models.word2vec.family import FAMILY as WORD2VEC_FAMILY
from qkv.storage import unwrap_model

__all__ = [
    "CAPABILITIES",
    "COMMANDS",
    "DECODE_STEPS",
    "ENCODER",
    "LANGUAGE_MODEL",
    "ROLES",
    "ROOMS",
    "TRANSLATOR",
    "WORD_VECTORS",
    "Family",
    "HFConversion",
    "build_model",
    "families",
    "family_of",
    "in_role",
    "refusal",
]

ROOMS: tuple[Family, ...] = (
    GPT_FAMILY,
    LLAMA_FAMILY,
    ENCODER_FAMILY,
    TRANSFORMER_FAMILY,
    RNNSEARCH_FAMILY,
    WORD2VEC_FAMILY,
)
"""Every family's description, one per folder of :mod:`qkv.models`."""

_FAMILIES: dict[str, Family] = {family.name: family for family in ROOMS}


def families() -> dict[str, Family]:
    """Every family by name ("gpt", "llama", "encoder", "transformer", "rnnsearch", "word2vec")."""
    return _FAMILIES


def family_of(thing: Any) -> Family:
    """The family of a model (also inside DDP or torch.compile), a config or its class, or a kind name ("gpt")."""
    kind: object
    if isinstance(thing, str):
        kind = thing
    elif isinstance(thing, type) and issubclass(thing, ModelConfig):
        kind = thing.kind
    else:
        config = thing if isinstance(thing, ModelConfig) else getattr(unwrap_model(thing), "config", None)
        kind = getattr(config, "kind", None)
    family = _FAMILIES.get(kind) if isinstance(kind, str) else None
    if family is None:
        raise QkvError(f"unknown model kind {kind!r}: qkv knows {', '.join(_FAMILIES)}")
    return family


T = TypeVar("T")


def in_role(thing: Any, role: str, typed: type[T], what: str) -> T:
    """``thing`` (a model or a config) after its family's description says its family plays ``role``
    (:meth:`Family.require_role`: a QkvError naming ``what`` otherwise), typed as the code of that role reads it
    (``typed``: the role's own class, GPT or GPTConfig for a language model's, Llama's included; no class is tested)."""
    family_of(thing).require_role(role, what)
    return cast(T, thing)


def build_model(config: ModelConfig) -> nn.Module:
    """The model a config describes, freshly initialised: GPTConfig -> GPT, LlamaConfig -> Llama, ..."""
    if not isinstance(config, ModelConfig):
        raise QkvError(f"cannot build a model from a {type(config).__name__}: give one of qkv's model configs")
    return family_of(config).model(config)
