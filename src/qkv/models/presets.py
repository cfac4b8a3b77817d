"""Named model sizes, from the paper's base model and GPT-2 small down to ones that train on a laptop CPU,
the Llama family (small ones, and the shapes of SmolLM-135M and Qwen2-0.5B), and RNNSearch, the recurrent
translator that came before (at the paper's proportions and a small one). Each family's folder lists its own
(``qkv/models/gpt/presets.py``, ...); this module gathers them through the family table.

A preset fixes the architecture; the vocabulary size usually comes from the tokenizer, so
``make_config("gpt-mini", vocab_size=tokenizer.vocab_size)`` fills it in. Any field can be overridden.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from qkv.errors import QkvError
from qkv.models.config import ModelConfig
from qkv.models.family import families

PRESETS: dict[str, tuple[type[ModelConfig], dict[str, Any]]] = {
    name: (family.config, fields) for family in families().values() for name, fields in family.presets.items()
}
"""Every preset by name: (its family's config class, its fields), from each family's ``presets.py``."""


def check_overrides(preset: str, names: Iterable[str]) -> None:
    """QkvError unless ``preset`` exists and its model has every field in ``names`` (``max_len`` included)."""
    if preset not in PRESETS:
        raise QkvError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}")
    cls = PRESETS[preset][0]
    unknown = sorted(set(names) - {f.name for f in dataclasses.fields(cls)} - {"max_len"})
    if unknown:
        raise QkvError(
            f"a {cls.kind} model has no {', '.join(unknown)} (preset {preset!r}): drop "
            f"{'that setting' if len(unknown) == 1 else 'those settings'} or choose a preset with "
            f"{'that field' if len(unknown) == 1 else 'those fields'}"
        )


def make_config(preset: str, **overrides: Any) -> ModelConfig:
    """The config of a named preset with some fields replaced (validated)."""
    check_overrides(preset, overrides)
    cls, fields = PRESETS[preset]
    if "max_len" in overrides and "context_length" not in overrides:  # the name before the rename to context_length
        overrides["context_length"] = overrides.pop("max_len")
    return cls(**{**fields, **overrides})
