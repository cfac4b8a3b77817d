"""GGUF's ``llama`` and ``qwen2`` architectures (SmolLM, Llama, Mistral, Qwen2) as qkv's Llama family.

llama.cpp stores the decoder of :mod:`qkv.pretrained.llama` under its own names: ``token_embd`` (W_E),
``blk.{i}.attn_norm`` / ``ffn_norm`` (the RMSNorm gains), ``attn_q`` / ``attn_k`` / ``attn_v`` /
``attn_output`` (W_q, W_k, W_v, W_o), ``ffn_gate`` / ``ffn_up`` / ``ffn_down`` (SwiGLU's W_g, W_1, W_2),
``output_norm`` and ``output`` (W_U; absent when tied to W_E). Two differences from a Hugging Face folder:

- in a ``llama`` file the rows of W_q and W_k are permuted for llama.cpp's pairwise RoPE
  (:func:`~qkv.gguf.names.rope_unpermute` undoes it); ``qwen2`` files keep Hugging Face's order, since
  llama.cpp runs Qwen2 with the "rotate half" RoPE qkv uses;
- the hyperparameters are metadata (``llama.block_count``, ``llama.attention.head_count_kv``, ...).

Qwen2's biases on W_q, W_k and W_v are ``attn_q.bias``, ...; a ``llama`` file holding such biases (or one on
W_o) is refused in one line. Llama 3.1's scaled RoPE is the tensor ``rope_freqs`` (:mod:`qkv.gguf.rope`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.gguf.dequantize import dequantize
from qkv.gguf.metadata import ArchMetadata
from qkv.gguf.names import BLOCK, W_E, W_U, Row, rope_permute, rope_unpermute, row
from qkv.gguf.reader import GGUFFile
from qkv.gguf.rope import ROPE_FREQS, rope_factors, scaling_from_factors
from qkv.models.llama.config import LlamaConfig


@dataclass(frozen=True)
class Dialect:
    """What one ``general.architecture`` of the Llama family stores differently."""

    pairwise_rope: bool  # W_q's and W_k's rows permuted per head for llama.cpp's pairwise RoPE
    qkv_bias: bool  # may hold biases on W_q, W_k and W_v


DIALECTS = {"llama": Dialect(pairwise_rope=True, qkv_bias=False), "qwen2": Dialect(pairwise_rope=False, qkv_bias=True)}
ARCHITECTURES: tuple[str, ...] = tuple(DIALECTS)
IGNORED: tuple[str, ...] = (r"rope_freqs\.weight",)
"""GGUF tensors that are no parameter (regular expressions): Llama 3's RoPE factors, read into the config."""


def config_from_gguf(meta: ArchMetadata, file: GGUFFile) -> LlamaConfig:
    """qkv's LlamaConfig from a ``llama`` / ``qwen2`` file's metadata and tensors."""
    tensors = set(file.tensors)
    d_model, n_heads = meta.count("embedding_length"), meta.count("attention.head_count")
    n_kv_heads = meta.count("attention.head_count_kv", n_heads)
    if d_model % n_heads or n_heads % n_kv_heads:
        raise QkvError(
            f"the GGUF metadata's embedding_length={d_model}, head_count={n_heads} and head_count_kv={n_kv_heads} "
            "do not divide (qkv's heads are embedding_length / head_count wide, each key/value head serving "
            "head_count / head_count_kv query heads): the file is damaged; convert the model again"
        )
    meta.check_head_dim(d_model // n_heads)
    if "blk.0.attn_output.bias" in tensors or "blk.0.ffn_up.bias" in tensors:
        raise QkvError(f"this {meta.arch} file has biases on W_o or the feed-forward, which qkv's Llama lacks")
    qkv_bias = "blk.0.attn_q.bias" in tensors
    if qkv_bias and not DIALECTS[meta.arch].qkv_bias:
        raise QkvError(f"this {meta.arch} file has biases on W_q, W_k and W_v, which qkv reads from qwen2 files only")
    head_dim, rope_base = d_model // n_heads, meta.rope_base(d_model // n_heads)
    scaling = None
    if ROPE_FREQS in tensors:  # Llama 3.1's scaled RoPE
        original = meta.count("rope.scaling.original_context_length", 8192)
        scaling = scaling_from_factors(dequantize(file.raw(ROPE_FREQS)), head_dim, rope_base, original)
    return LlamaConfig(
        vocab_size=meta.vocab_size(),
        context_length=meta.count("context_length"),
        n_layers=meta.count("block_count"),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=meta.count("feed_forward_length"),
        layer_norm_eps=meta.positive("attention.layer_norm_rms_epsilon"),
        rope_base=rope_base,
        rope_scaling=scaling,
        qkv_bias=qkv_bias,
        tie_embeddings="output.weight" not in tensors,
        dropout=0.0,
    )


def rows(config: LlamaConfig, arch: str) -> list[Row]:
    """The name table of ``arch`` ("llama" or "qwen2") for a model of ``config``."""
    q: dict[str, Any] = {}
    k: dict[str, Any] = {}
    if DIALECTS[arch].pairwise_rope:  # rows permuted per head: query heads for W_q, key heads for W_k
        n_kv_heads = config.n_kv_heads
        assert n_kv_heads is not None  # BaseConfig.__post_init__ fills it
        q = dict(to_qkv=rope_unpermute(config.n_heads), to_gguf=rope_permute(config.n_heads))
        k = dict(to_qkv=rope_unpermute(n_kv_heads), to_gguf=rope_permute(n_kv_heads))
    attn = BLOCK + ".self_attn."
    table = [
        row("token_embd.weight", W_E),
        row("blk.{i}.attn_norm.weight", BLOCK + ".self_attn_sublayer.norm.weight"),  # RMSNorm gain
        row("blk.{i}.attn_q.weight", attn + "query.weight", **q),  # W_q
        row("blk.{i}.attn_k.weight", attn + "key.weight", **k),  # W_k: n_kv_heads * d_k rows
        row("blk.{i}.attn_v.weight", attn + "value.weight"),  # W_v
        row("blk.{i}.attn_output.weight", attn + "out_proj.weight"),  # W_o
        row("blk.{i}.ffn_norm.weight", BLOCK + ".ffn_sublayer.norm.weight"),
        row("blk.{i}.ffn_gate.weight", BLOCK + ".feed_forward.gate.weight"),  # W_g, inside silu
        row("blk.{i}.ffn_up.weight", BLOCK + ".feed_forward.linear1.weight"),  # W_1
        row("blk.{i}.ffn_down.weight", BLOCK + ".feed_forward.linear2.weight"),  # W_2
        row("output_norm.weight", "decoder.final_norm.weight"),
        row("output.weight", W_U),  # W_U (absent when tied to W_E)
    ]
    if config.qkv_bias:  # Qwen2: biases on W_q, W_k, W_v (never permuted: only qwen2 files have them)
        table += [row(f"blk.{{i}}.attn_{x}.bias", attn + f"{name}.bias") for x, name in
                  (("q", "query"), ("k", "key"), ("v", "value"))]  # fmt: skip
    return table


def export_architecture(config: LlamaConfig) -> str:
    """The architecture a qkv Llama is written as: qwen2 with biases on W_q, W_k, W_v, else llama; refused in
    one line when llama.cpp's cannot run it."""
    checks = [
        ("norm", config.norm, "rmsnorm"),
        ("feed_forward", config.feed_forward, "glu"),
        ("activation", config.activation, "silu"),
        ("positional", config.positional, "rope"),
        ("bias", config.bias, False),
        ("norm_first", config.norm_first, True),
        ("final_norm", config.final_norm, True),
        ("scale_embeddings", config.scale_embeddings, False),
    ]
    for field, value, wanted in checks:
        if value != wanted:
            raise QkvError(
                f"this Llama has {field}={value!r}, and llama.cpp's llama and qwen2 architectures need "
                f"{field}={wanted!r}: GGUF cannot express this model"
            )
    return next(arch for arch, said in DIALECTS.items() if said.qkv_bias == config.qkv_bias)


def extra_tensors(config: LlamaConfig) -> dict[str, Tensor]:
    """Tensors that are no parameter: Llama 3's RoPE factors (rope_freqs.weight) when the RoPE is scaled."""
    if config.rope_scaling is None:
        return {}
    return {ROPE_FREQS: rope_factors(config.head_dim, config.rope_base, config.rope_scaling)}


def metadata(config: LlamaConfig, arch: str) -> dict[str, object]:
    """The hyperparameters of ``config`` as ``arch``'s GGUF metadata."""
    return {
        f"{arch}.context_length": config.context_length,
        f"{arch}.embedding_length": config.d_model,
        f"{arch}.block_count": config.n_layers,
        f"{arch}.feed_forward_length": config.d_ff,
        f"{arch}.attention.head_count": config.n_heads,
        f"{arch}.attention.head_count_kv": config.n_kv_heads,
        f"{arch}.rope.dimension_count": config.head_dim,
        f"{arch}.rope.freq_base": float(config.rope_base),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.layer_norm_eps),
        f"{arch}.vocab_size": config.vocab_size,
        **(
            {f"{arch}.rope.scaling.original_context_length": config.rope_scaling["original_max_position_embeddings"]}
            if config.rope_scaling
            else {}
        ),
    }


def export(model: nn.Module, *, approximate_gelu: bool = False) -> tuple[str, LlamaConfig, dict[str, Tensor], dict]:
    """(architecture, config, tensors by qkv name, extra tensors) of the file ``model`` becomes: ``llama``, or
    ``qwen2`` with biases on W_q, W_k, W_v; ``approximate_gelu`` does not apply (a Llama has no GELU)."""
    config = cast(LlamaConfig, model.config)
    arch = export_architecture(config)
    state = {name: tensor.detach().float().cpu() for name, tensor in model.state_dict().items()}
    return arch, config, state, extra_tensors(config)
