"""GGUF's ``gpt2`` and ``starcoder2`` architectures as qkv's :class:`~qkv.models.GPT`, and what any qkv GPT needs to
become one of them: ``gpt2`` for learned (or sinusoidal, or no) positions, ``starcoder2`` for rotary positions.

llama.cpp stores GPT-2 (:mod:`qkv.models.gpt.huggingface`) as ``token_embd`` (W_E), ``position_embd`` (the learned
positions), ``blk.{i}.attn_norm`` (LayerNorm, weight and bias), ``attn_qkv`` (W_q, W_k, W_v stacked by rows:
(3 d_model, d_model), as nn.Linear stores them, unlike Hugging Face's transposed Conv1D), ``attn_output``
(W_o), ``ffn_norm``, ``ffn_up`` (W_1), ``ffn_down`` (W_2), ``output_norm`` and ``output`` (W_U; absent when
tied). llama.cpp runs every layer with biases and GELU's tanh approximation. ``starcoder2`` is the same blocks
with W_q, W_k and W_v as separate tensors (``attn_q``, ``attn_k``: head_count_kv heads, ``attn_v``) and rotary
positions instead of ``position_embd``.

Writing a qkv GPT (:func:`export_state`) fills in what that fixed shape needs and the GPT lacks, each step
leaving the model's outputs as they were: zero biases where it has none, W_k and W_v repeated per query head
when its attention is grouped, the sinusoidal table (or zeros) as position_embd, and W_E scaled by
sqrt(d_model) with the unscaled W_E as ``output`` when the embeddings are scaled. What cannot be rewritten
that way (RMSNorm, a gated feed-forward, post-LN blocks, another activation) is refused in one line.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.gguf.metadata import ArchMetadata
from qkv.gguf.names import BLOCK, W_E, W_POS, W_U, Row, cat_rows, row, split_rows
from qkv.gguf.reader import GGUFFile
from qkv.models.gpt.config import GPTConfig

if TYPE_CHECKING:
    from qkv.models.gpt.model import GPT

IGNORED: tuple[str, ...] = ()
ATTN = BLOCK + ".self_attn."


def weight_and_bias(gguf: str, qkv: str) -> list[Row]:
    """Two rows: ``gguf.weight`` <-> ``qkv.weight`` and ``gguf.bias`` <-> ``qkv.bias``."""
    return [row(f"{gguf}.{p}", f"{qkv}.{p}") for p in ("weight", "bias")]


def block_rows(config: GPTConfig) -> list[Row]:
    """The norms, W_o and the feed-forward of each block, and the final norm (gpt2 and starcoder2 share them)."""
    return [
        *weight_and_bias("blk.{i}.attn_norm", BLOCK + ".self_attn_sublayer.norm"),
        *weight_and_bias("blk.{i}.attn_output", ATTN + "out_proj"),  # W_o
        *weight_and_bias("blk.{i}.ffn_norm", BLOCK + ".ffn_sublayer.norm"),
        *weight_and_bias("blk.{i}.ffn_up", BLOCK + ".feed_forward.linear1"),  # W_1
        *weight_and_bias("blk.{i}.ffn_down", BLOCK + ".feed_forward.linear2"),  # W_2
        *weight_and_bias("output_norm", "decoder.final_norm"),
        row("token_embd.weight", W_E),
        row("output.weight", W_U),  # absent when tied to W_E
    ]


def _gpt2_rows(config: GPTConfig, arch: str = "gpt2") -> list[Row]:
    """The name table of ``gpt2`` for a model of ``config``."""
    sizes = (config.d_model, config.kv_dim, config.kv_dim)
    fused = [
        row(
            f"blk.{{i}}.attn_qkv.{p}",
            *(ATTN + f"{m}.{p}" for m in ("query", "key", "value")),
            to_qkv=split_rows(*sizes),
            to_gguf=cat_rows,
        )  # fmt: skip
        for p in ("weight", "bias")
    ]
    return [row("position_embd.weight", W_POS), *fused, *block_rows(config)]


def _gpt2_config(meta: ArchMetadata, file: GGUFFile) -> GPTConfig:
    """qkv's GPTConfig from a ``gpt2`` file's metadata."""
    d_model, n_heads = meta.count("embedding_length"), meta.count("attention.head_count")
    if d_model % n_heads:
        raise QkvError(f"the GGUF metadata's embedding_length={d_model} is not divisible by head_count={n_heads}")
    meta.check_head_dim(d_model // n_heads)
    return GPTConfig(
        vocab_size=meta.vocab_size(),
        context_length=meta.count("context_length"),
        n_layers=meta.count("block_count"),
        d_model=d_model,
        n_heads=n_heads,
        d_ff=meta.count("feed_forward_length", 4 * d_model),
        activation="gelu_tanh",
        layer_norm_eps=meta.positive("attention.layer_norm_epsilon"),
        dropout=0.0,
        norm_first=True,
        final_norm=True,
        positional="learned",
        bias=True,
        tie_embeddings="output.weight" not in file.tensors,
    )


def check_gpt(config: GPTConfig, arch: str, *, approximate_gelu: bool) -> None:
    """QkvError unless llama.cpp's ``arch`` (gpt2 or starcoder2) runs a GPT of ``config`` as qkv does."""
    for field, wanted in (("norm", "layernorm"), ("feed_forward", "mlp"), ("norm_first", True), ("final_norm", True)):
        if getattr(config, field) != wanted:
            raise QkvError(
                f"this GPT has {field}={getattr(config, field)!r}, and llama.cpp's {arch} architecture needs "
                f"{field}={wanted!r}: GGUF cannot express this model"
            )
    if config.activation == "gelu" and not approximate_gelu:
        raise QkvError(
            f"this GPT uses the exact GELU (activation=gelu), and llama.cpp's {arch} runs its tanh approximation "
            "(gelu_tanh): add --gguf-approximate-gelu to accept logits that differ slightly, or train with "
            "--activation gelu_tanh"
        )
    if config.activation not in ("gelu", "gelu_tanh"):
        raise QkvError(f"this GPT has activation={config.activation!r}, and llama.cpp's {arch} runs GELU only")
    if config.rope_scaling is not None:
        raise QkvError(f"this GPT scales RoPE (rope_scaling), which llama.cpp's {arch} architecture cannot")


def _repeat_heads(t: Tensor, n_kv_heads: int, group: int) -> Tensor:
    """W_k or W_v (n_kv_heads * d_k, ...) -> (n_heads * d_k, ...), each key/value head once per query head of
    its group: grouped attention written as plain multi-head attention, with the same outputs."""
    return t.reshape(n_kv_heads, -1, *t.shape[1:]).repeat_interleave(group, dim=0).reshape(-1, *t.shape[1:])


def export_state(model: nn.Module, *, multi_head: bool) -> tuple[GPTConfig, dict[str, Tensor]]:
    """The config and tensors of ``model`` (a qkv GPT) rewritten as a GPT-2-style model with biases, learned
    positions (gpt2) and unscaled embeddings; ``multi_head`` repeats grouped key/value heads (gpt2 has none)."""
    gpt = cast("GPT", model)
    config = gpt.config
    state = {name: t.detach().float().cpu() for name, t in model.state_dict().items()}
    n_kv_heads = config.n_kv_heads
    assert n_kv_heads is not None  # BaseConfig.__post_init__ fills it
    if multi_head and n_kv_heads != config.n_heads:
        for name in [n for n in state if ".self_attn.key." in n or ".self_attn.value." in n]:
            state[name] = _repeat_heads(state[name], n_kv_heads, config.n_heads // n_kv_heads)
    if multi_head and config.positional != "learned":  # gpt2 always adds a position row: the table, or zeros
        table = getattr(gpt.embedding.positional_encoding, "table", None)
        state[W_POS] = table.float().cpu() if table is not None else torch.zeros(config.context_length, config.d_model)
    tied = config.tie_embeddings
    if config.scale_embeddings:  # x = sqrt(d) W_E[id]: scale the rows; W_U keeps the unscaled ones
        state[W_U] = state[W_E] if tied else state[W_U]
        state[W_E], tied = state[W_E] * math.sqrt(config.d_model), False
    for name in [n for n in state if n.endswith(".weight") and n.replace(".weight", ".bias") not in state]:
        if name not in (W_E, W_U, W_POS):
            state[name.replace(".weight", ".bias")] = torch.zeros(state[name].shape[0])
    changes: dict[str, object] = dict(
        bias=True, qkv_bias=True, scale_embeddings=False, tie_embeddings=tied, dropout=0.0
    )
    if multi_head:
        changes.update(n_kv_heads=config.n_heads, positional="learned")
    return config.replace(**changes, attention_dropout=0.0, activation_dropout=0.0), state


def _gpt2_metadata(config: GPTConfig, arch: str = "gpt2") -> dict[str, object]:
    """The hyperparameters of ``config`` as ``gpt2`` GGUF metadata."""
    return {
        f"{arch}.context_length": config.context_length,
        f"{arch}.embedding_length": config.d_model,
        f"{arch}.feed_forward_length": config.d_ff,
        f"{arch}.block_count": config.n_layers,
        f"{arch}.attention.head_count": config.n_heads,
        f"{arch}.attention.layer_norm_epsilon": float(config.layer_norm_eps),
    }


def _starcoder2_rows(config: GPTConfig, arch: str = "starcoder2") -> list[Row]:
    """The name table of ``starcoder2`` for a model of ``config``."""
    separate = [
        *weight_and_bias("blk.{i}.attn_q", ATTN + "query"),  # W_q
        *weight_and_bias("blk.{i}.attn_k", ATTN + "key"),  # W_k: head_count_kv * d_k rows
        *weight_and_bias("blk.{i}.attn_v", ATTN + "value"),  # W_v
    ]
    return [*separate, *block_rows(config)]


def _starcoder2_config(meta: ArchMetadata, file: GGUFFile) -> GPTConfig:
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


def _starcoder2_metadata(config: GPTConfig, arch: str = "starcoder2") -> dict[str, object]:
    """The hyperparameters of ``config`` as ``starcoder2`` GGUF metadata."""
    return {
        **_gpt2_metadata(config, arch),
        f"{arch}.attention.head_count_kv": config.n_kv_heads,
        f"{arch}.rope.dimension_count": config.head_dim,
        f"{arch}.rope.freq_base": float(config.rope_base),
    }


@dataclass(frozen=True)
class Dialect:
    """What one architecture's files hold: its name table, config and metadata for a model of a config, and
    whether its positions rotate (``starcoder2``) or are a learned row added to W_E (``gpt2``: one head of keys and
    values per query head, stored stacked as ``attn_qkv``)."""

    rows: Callable[[GPTConfig, str], list[Row]]
    config: Callable[[ArchMetadata, GGUFFile], GPTConfig]
    metadata: Callable[[GPTConfig, str], dict[str, object]]
    rotary: bool


DIALECTS = {
    "gpt2": Dialect(_gpt2_rows, _gpt2_config, _gpt2_metadata, rotary=False),
    "starcoder2": Dialect(_starcoder2_rows, _starcoder2_config, _starcoder2_metadata, rotary=True),
}
ARCHITECTURES: tuple[str, ...] = tuple(DIALECTS)


def config_from_gguf(meta: ArchMetadata, file: GGUFFile) -> GPTConfig:
    """qkv's GPTConfig from a ``gpt2`` or ``starcoder2`` file's metadata."""
    dialect = DIALECTS.get(file.architecture or "")
    if dialect is None:
        raise QkvError(f"a GGUF file of architecture {file.architecture!r} is not a GPT's ({', '.join(DIALECTS)})")
    return dialect.config(meta, file)


def rows(config: GPTConfig, arch: str) -> list[Row]:
    """The name table of ``arch`` for a model of ``config``."""
    return DIALECTS[arch].rows(config, arch)


def metadata(config: GPTConfig, arch: str) -> dict[str, object]:
    """The hyperparameters of ``config`` as ``arch``'s GGUF metadata."""
    return DIALECTS[arch].metadata(config, arch)


def export(model: nn.Module, *, approximate_gelu: bool = False) -> tuple[str, GPTConfig, dict[str, Tensor], dict]:
    """(architecture, config, tensors by qkv name, extra tensors) of the file ``model`` becomes: ``starcoder2``
    with rotary positions, else ``gpt2``; what neither can hold is one line."""
    config = cast(GPTConfig, model.config)
    rotary = config.positional == "rope"
    arch = next(name for name, dialect in DIALECTS.items() if dialect.rotary == rotary)
    check_gpt(config, arch, approximate_gelu=approximate_gelu)
    config, state = export_state(model, multi_head=not rotary)
    return arch, config, state, {}
