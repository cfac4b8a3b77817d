"""What every model configuration shares: a typed dataclass, validated when it is made, saved as JSON.

Each family's own config class lives in its folder (``GPTConfig`` in :mod:`qkv.models.gpt.config`, ...) and
derives from :class:`ModelConfig` (RNNSearch, Word2Vec) or :class:`BaseConfig` (the Transformers). The
Transformers' fields use the sources' names: d_model (width of every token vector), n_heads (h), d_ff
(hidden width of the token-wise feed-forward network), n_layers (N). d_k = d_v = d_model / n_heads.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from qkv.errors import QkvError

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu", "relu2")
POSITIONALS = ("sinusoidal", "learned", "rope", "none")
NORMS = ("layernorm", "rmsnorm")
NORM_TITLES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}  # how the views name them
FEED_FORWARDS = ("mlp", "glu")


_CHECKS = {
    "int": (lambda v: isinstance(v, int) and not isinstance(v, bool), "a whole number"),
    "float": (lambda v: isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v), "a finite number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "str": (lambda v: isinstance(v, str), "a string"),
    "dict": (lambda v: isinstance(v, dict), "an object"),
}
"""A field's declared type -> (the check of a value, how a message names it)."""


def _declared(annotation: Any) -> set[str]:
    """The types a field's annotation names ("int | None" -> {"int", "None"}; "dict[str, Any]" -> {"dict"})."""
    return {part.strip().split("[")[0] for part in str(annotation).split("|")}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


CONFIG_CLASSES: dict[str, type[ModelConfig]] = {}
"""Every family's config class by its kind ("gpt" -> GPTConfig, ...), filled as the classes are defined."""


@dataclass(frozen=True)
class BlockSizes:
    """One residual block's widths, as the memory estimates count them (:mod:`qkv.models.memory`)."""

    d_ff: int  # the feed-forward's hidden width
    kv_dim: int  # keys' and values' width: h_kv d_k
    heads: int  # h: one attention map over the n positions each
    gated: bool  # W_2 (act(W_g x) * W_1 x): four d_ff-wide tensors kept instead of two


@dataclass
class ModelConfig:
    """What every model config does, whatever its fields: name its kind, validate, round-trip JSON.

    A subclass that sets ``kind`` is a family's config: the kind is saved in config.json (``"model"``) and
    :meth:`from_dict` finds the class from it."""

    kind: ClassVar[str] = "model"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            CONFIG_CLASSES[cls.kind] = cls

    def __post_init__(self) -> None:
        self.check_types()
        self.validate()

    def validate(self) -> None:
        """Check that the fields fit together; raise QkvError saying what to change."""

    def rotary(self) -> bool:
        """Whether positions enter by rotating queries and keys (RoPE); the Transformers' configs say."""
        return False

    def block_sizes(self) -> BlockSizes | None:
        """The widths of one residual block (the Transformers'); None for a model without attention blocks."""
        return None

    def check_types(self) -> None:
        """Each field holds a value of its declared type: a whole number (not a bool, not 64.0, not "64"), a finite
        number, true or false, a string; a QkvError names the first that does not (from config.json, Hugging Face
        or GGUF metadata, or Python), before any size is computed from it."""
        for f in fields(self):
            value, kinds = getattr(self, f.name), _declared(f.type)
            if value is None and "None" in kinds or not kinds & set(_CHECKS):
                continue
            if not any(_CHECKS[kind][0](value) for kind in kinds if kind in _CHECKS):
                wanted = " or ".join(_CHECKS[kind][1] for kind in _CHECKS if kind in kinds)
                raise QkvError(f"{f.name}={value!r} must be {wanted}" + (" or null" if "None" in kinds else ""))

    def _require_positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise QkvError(f"{name}={value!r} must be a positive whole number")

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.kind, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        """Rebuild a config from :meth:`to_dict` output; unknown keys are an error that names them.

        On :class:`ModelConfig` or :class:`BaseConfig` the saved ``"model"`` kind picks the class."""
        data = dict(data)
        if "max_len" in data and "context_length" not in data:  # configs saved before the rename to context_length
            data["context_length"] = data.pop("max_len")
        kind = data.pop("model", cls.kind)
        target = CONFIG_CLASSES.get(kind) if cls in (ModelConfig, BaseConfig) else cls
        if target is None:
            raise QkvError(f"unknown model kind {kind!r} in config: expected one of {', '.join(CONFIG_CLASSES)}")
        known = {f.name for f in fields(target)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise QkvError(
                f"config has unknown fields {unknown} for a {kind} model: remove them or check the qkv version"
            )
        return target(**data)

    def save(self, path: str | Path) -> None:
        from qkv.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Any:
        from qkv.io import read_json

        return cls.from_dict(read_json(path, what="model config"))

    def replace(self, **changes: Any) -> Any:
        """A copy with some fields changed (validated again)."""
        data = asdict(self)
        data.update(changes)
        return type(self)(**data)


@dataclass
class BaseConfig(ModelConfig):
    """Fields shared by every Transformer model: the attention blocks and the embeddings."""

    d_model: int = 128
    n_heads: int = 4
    d_ff: int | None = None  # default 4 * d_model, as in the paper (512 -> 2048)
    dropout: float = 0.0
    attention_dropout: float | None = None  # dropout on attention weights; default: ``dropout``
    activation_dropout: float | None = None  # dropout inside the FFN, after the activation; default: ``dropout``
    activation: str = "gelu"
    norm_first: bool = True  # pre-LN (GPT-2) if True, post-LN (the paper) if False
    layer_norm_eps: float = 1e-5  # the epsilon of every norm, LayerNorm or RMSNorm
    norm: str = "layernorm"  # "layernorm" (the paper, GPT-2) or "rmsnorm" (Llama: no mean, no bias)
    feed_forward: str = "mlp"  # "mlp": W_2 act(W_1 x); "glu": W_2 (act(W_g x) * W_1 x) (SwiGLU with silu)
    n_kv_heads: int | None = None  # key/value heads; default n_heads; fewer: grouped-query attention, 1: multi-query
    bias: bool = True
    qkv_bias: bool | None = None  # biases on W_q, W_k, W_v; default: ``bias`` (Qwen2: only these have biases)
    positional: str = "learned"
    sinusoidal_interleaved: bool = True
    rope_base: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # Llama 3.1's {"rope_type": "llama3", "factor": ...}; None: plain RoPE
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (the paper, section 3.4)
    tie_embeddings: bool = True  # unembedding W_U shares its matrix with the embedding W_E
    final_norm: bool | None = None  # LayerNorm after the last block; default: ``norm_first``
    init_std: float = 0.02
    context_length: int = 256  # the longest sequence the model attends over (positions it has)

    def __post_init__(self) -> None:
        self.check_types()  # before d_ff = 4 * d_model turns "64" into "64646464"
        if self.d_ff is None:
            self.d_ff = 4 * self.d_model if self.feed_forward == "mlp" else glu_width(self.d_model)
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.qkv_bias is None:
            self.qkv_bias = self.bias
        if self.attention_dropout is None:
            self.attention_dropout = self.dropout
        if self.activation_dropout is None:
            self.activation_dropout = self.dropout
        if self.final_norm is None:
            self.final_norm = self.norm_first
        self.validate()

    @property
    def head_dim(self) -> int:
        """d_k = d_v = d_model / n_heads."""
        return self.d_model // self.n_heads

    def rotary(self) -> bool:
        return self.positional == "rope"

    def block_sizes(self) -> BlockSizes:
        assert self.d_ff is not None  # __post_init__ fills it
        return BlockSizes(self.d_ff, self.kv_dim, self.n_heads, self.feed_forward == "glu")

    def validate(self) -> None:
        self._require_positive("d_model", "n_heads", "d_ff", "context_length")
        if self.d_model % self.n_heads:
            heads = [h for h in _divisors(self.d_model) if h <= 64]
            lower = self.d_model - self.d_model % self.n_heads
            raise QkvError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads} (each head gets "
                f"d_model/n_heads dimensions): use n_heads in {heads} or d_model={lower or self.n_heads} "
                f"or {lower + self.n_heads}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise QkvError(f"{name}={value} must be in [0, 1)")
        if self.activation not in ACTIVATIONS:
            raise QkvError(f"activation={self.activation!r} is unknown: choose one of {', '.join(ACTIVATIONS)}")
        self._validate_positions()
        if self.layer_norm_eps <= 0 or self.init_std <= 0:
            raise QkvError("layer_norm_eps and init_std must be positive")
        if self.norm not in NORMS:
            raise QkvError(f"norm={self.norm!r} is unknown: choose one of {', '.join(NORMS)}")
        if self.feed_forward not in FEED_FORWARDS:
            raise QkvError(f"feed_forward={self.feed_forward!r} is unknown: choose one of {', '.join(FEED_FORWARDS)}")
        self._require_positive("n_kv_heads")
        if self.n_heads % self.n_kv_heads:  # type: ignore[operator]
            raise QkvError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads} (each key/value head "
                f"serves n_heads/n_kv_heads query heads): use n_kv_heads in {_divisors(self.n_heads)}"
            )

    def _validate_positions(self) -> None:
        """The positional scheme and, for rotary positions, an even head size and a positive base."""
        if self.positional not in POSITIONALS:
            raise QkvError(f"positional={self.positional!r} is unknown: choose one of {', '.join(POSITIONALS)}")
        if self.positional == "rope" and self.head_dim % 2:
            raise QkvError(
                f"rotary positions need an even head size, but d_model/n_heads = {self.head_dim}: "
                "change d_model or n_heads"
            )
        if self.rope_base <= 0:
            raise QkvError(
                f"rope_base={self.rope_base!r} must be above 0 (the base of the rotary angles, Hugging Face's "
                "rope_theta): e.g. 10000, as in RoFormer"
            )
        if self.rope_scaling is not None:
            _check_rope_scaling(self.rope_scaling)

    @property
    def kv_dim(self) -> int:
        """Width of W_k's and W_v's output: n_kv_heads * d_k (d_model unless attention is grouped)."""
        return self.n_kv_heads * self.head_dim  # type: ignore[operator]


ROPE_SCALING_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _check_rope_scaling(scaling: Any) -> None:
    """rope_scaling must be Llama 3's rule with its four numbers (:func:`qkv.layers.positional.rope_frequencies`)."""
    if not isinstance(scaling, dict) or scaling.get("rope_type") != "llama3":
        raise QkvError(f'rope_scaling={scaling!r} is unknown: qkv knows {{"rope_type": "llama3", ...}} or null')
    missing = [name for name in ROPE_SCALING_FIELDS if not isinstance(scaling.get(name), int | float)]
    if missing:
        raise QkvError(
            f"rope_scaling lacks the number(s) {', '.join(missing)}: give all of {', '.join(ROPE_SCALING_FIELDS)}"
        )
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"] or scaling["factor"] <= 0:
        raise QkvError("rope_scaling needs factor > 0 and high_freq_factor > low_freq_factor (as Llama 3.1's has)")


def glu_width(d_model: int, multiple: int = 32) -> int:
    """A gated feed-forward's default d_ff: 8/3 d_model (as many parameters as the 4 d_model MLP, with three
    matrices instead of two; Shazeer 2020, Llama), rounded up to a multiple of ``multiple``."""
    return multiple * math.ceil(8 * d_model / 3 / multiple)


def init_scale(config: BaseConfig, n_layers: int) -> float:
    """Std of residual-output projections: init_std / sqrt(2 N), GPT-2's scaled initialisation."""
    return config.init_std / math.sqrt(2 * n_layers)
