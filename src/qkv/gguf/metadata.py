"""Reading an architecture's numbers from GGUF metadata, each checked, each problem one line.

llama.cpp prefixes a model's hyperparameters with its architecture: ``llama.block_count``,
``llama.attention.head_count_kv``, ``gpt2.attention.layer_norm_epsilon``. :class:`ArchMetadata` reads them
by their suffix and checks what qkv would otherwise build a broken model from: counts must be positive whole
numbers, epsilons positive and finite, RoPE must rotate whole heads and carry no scaling qkv cannot run.
"""

from __future__ import annotations

import math
from typing import Any

from qkv.errors import QkvError

_DAMAGED = "the file is damaged or was written wrongly; convert the model again"


class ArchMetadata:
    """The metadata of a GGUF file whose general.architecture is ``arch``."""

    def __init__(self, metadata: dict[str, Any], arch: str) -> None:
        self.metadata, self.arch = metadata, arch

    def key(self, name: str) -> str:
        return f"{self.arch}.{name}"

    def get(self, name: str, default: Any = None) -> Any:
        return self.metadata.get(self.key(name), default)

    def count(self, name: str, default: int | None = None) -> int:
        """A positive whole number ``{arch}.{name}``; absent: ``default``, or a QkvError when there is none."""
        key = self.key(name)
        if key not in self.metadata:
            if default is None:
                raise QkvError(f"the GGUF metadata lacks {key}, which qkv needs to build the model: {_DAMAGED}")
            return default
        value = self.metadata[key]
        if isinstance(value, list):
            raise QkvError(
                f"the GGUF metadata gives {key} per layer ({value[:4]}...), and qkv's layers all have the same "
                "shape: qkv cannot run this model"
            )
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise QkvError(f"the GGUF metadata sets {key}={value!r}, which must be a positive whole number: {_DAMAGED}")
        return value

    def positive(self, name: str, default: float | None = None) -> float:
        """A positive finite number ``{arch}.{name}`` (an epsilon, RoPE's base)."""
        key = self.key(name)
        value = self.metadata.get(key, default)
        if value is None:
            raise QkvError(f"the GGUF metadata lacks {key}, which qkv needs to build the model: {_DAMAGED}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise QkvError(f"the GGUF metadata sets {key}={value!r}, which must be a positive number: {_DAMAGED}")
        return float(value)

    def check_head_dim(self, head_dim: int) -> None:
        """Key and value heads (attention.key_length / value_length) must be d_model / n_heads wide."""
        for name in ("attention.key_length", "attention.value_length"):
            width = self.get(name)
            if width is not None and width != head_dim:
                raise QkvError(
                    f"the GGUF metadata sets {self.key(name)}={width!r}, and qkv's heads are embedding_length / "
                    f"head_count = {head_dim} wide: qkv cannot run this model"
                )

    def rope_base(self, head_dim: int) -> float:
        """RoPE's base (rope.freq_base, 10000 when absent), after checking that RoPE rotates whole heads
        (rope.dimension_count = head_dim) and is not scaled (rope.scaling.type, rope.scale_linear)."""
        dims = self.get("rope.dimension_count", head_dim)
        if dims != head_dim:
            raise QkvError(
                f"the GGUF metadata sets {self.key('rope.dimension_count')}={dims!r}: RoPE rotates part of each "
                f"head, and qkv's RoPE rotates the whole head ({head_dim} dimensions): qkv cannot run this model"
            )
        kind, factor = self.get("rope.scaling.type", "none"), self.get("rope.scaling.factor", 1.0)
        linear = self.get("rope.scale_linear", 1.0)
        if (kind != "none" and factor != 1.0) or linear != 1.0:
            shown = f"{self.key('rope.scaling.type')}={kind!r}, factor {factor if linear == 1.0 else linear}"
            raise QkvError(
                f"the GGUF metadata scales RoPE ({shown}), and qkv's RoPE knows no such scaling: qkv cannot run "
                "this model"
            )
        return self.positive("rope.freq_base", 10000.0)

    def vocab_size(self) -> int:
        """{arch}.vocab_size, else the number of tokens in tokenizer.ggml.tokens."""
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        default = len(tokens) if isinstance(tokens, list) and tokens else None
        return self.count("vocab_size", default)
