"""GGUF's ``starcoder2`` architecture as qkv's :class:`~qkv.models.GPT` with rotary positions.

StarCoder2 is the GPT of :mod:`qkv.gguf.gpt2` (LayerNorm with biases, an MLP with GELU's tanh approximation,
biases everywhere) with rotary positions in place of position_embd and grouped-query attention: W_q, W_k,
W_v are separate tensors (``blk.{i}.attn_q``, ``attn_k``, ``attn_v``, each with a bias), W_k and W_v with
head_count_kv heads. llama.cpp rotates them "rotate half" (NEOX) style, as qkv does, so nothing is
permuted. It is how a qkv GPT trained with ``positional="rope"`` (the small presets) runs in llama.cpp.
"""

from __future__ import annotations

from qkv.errors import QkvError
from qkv.gguf.gpt2 import ATTN, IGNORED, block_rows, check_gpt, export_state, weight_and_bias
from qkv.gguf.gpt2 import metadata as gpt2_metadata
from qkv.gguf.metadata import ArchMetadata
from qkv.gguf.names import Row
from qkv.gguf.reader import GGUFFile
from qkv.models.config import GPTConfig

ARCHITECTURES = ("starcoder2",)
__all__ = ["ARCHITECTURES", "IGNORED", "check_gpt", "config_from_gguf", "export_state", "metadata", "rows"]


def rows(config: GPTConfig, arch: str = "starcoder2") -> list[Row]:
    """The name table of ``starcoder2`` for a model of ``config``."""
    separate = [
        *weight_and_bias("blk.{i}.attn_q", ATTN + "query"),  # W_q
        *weight_and_bias("blk.{i}.attn_k", ATTN + "key"),  # W_k: head_count_kv * d_k rows
        *weight_and_bias("blk.{i}.attn_v", ATTN + "value"),  # W_v
    ]
    return [*separate, *block_rows(config)]


def config_from_gguf(meta: ArchMetadata, file: GGUFFile) -> GPTConfig:
    """qkv's GPTConfig (rotary positions) from a ``starcoder2`` file's metadata."""
    d_model, n_heads = meta.count("embedding_length"), meta.count("attention.head_count")
    n_kv_heads = meta.count("attention.head_count_kv", n_heads)
    if d_model % n_heads or n_heads % n_kv_heads:
        raise QkvError(
            f"the GGUF metadata's embedding_length={d_model}, head_count={n_heads} and head_count_kv={n_kv_heads} "
            "do not divide: the file is damaged; convert the model again"
        )
    meta.check_head_dim(d_model // n_heads)
    return GPTConfig(
        vocab_size=meta.vocab_size(),
        context_length=meta.count("context_length"),
        n_layers=meta.count("block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=meta.count("feed_forward_length", 4 * d_model),
        activation="gelu_tanh",
        layer_norm_eps=meta.positive("attention.layer_norm_epsilon"),
        dropout=0.0,
        norm_first=True,
        final_norm=True,
        positional="rope",
        rope_base=meta.rope_base(d_model // n_heads),
        bias=True,
        tie_embeddings="output.weight" not in file.tensors,
    )


def metadata(config: GPTConfig, arch: str = "starcoder2") -> dict[str, object]:
    """The hyperparameters of ``config`` as ``starcoder2`` GGUF metadata."""
    return {
        **gpt2_metadata(config, arch),
        f"{arch}.attention.head_count_kv": config.n_kv_heads,
        f"{arch}.rope.dimension_count": config.head_dim,
        f"{arch}.rope.freq_base": float(config.rope_base),
    }
