"""Llama, Qwen2 and Mistral (LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM) as qkv's Llama family.

The three share one decoder (Touvron et al. 2023; the Qwen2 and Mistral reports change only what is noted
below): token embedding W_E (``embed_tokens``), N pre-norm blocks (``layers.{i}``: RMSNorm
``input_layernorm`` -> causal self-attention ``self_attn`` with rotary positions on q and k -> residual,
RMSNorm ``post_attention_layernorm`` -> SwiGLU ``mlp`` -> residual), a final RMSNorm ``norm`` and the
unembedding W_U (``lm_head``), tied to W_E only when ``tie_word_embeddings`` says so (SmolLM, Qwen2-0.5B).

- attention is grouped: ``q_proj`` is W_q (n_heads * d_k rows), ``k_proj`` and ``v_proj`` are W_k and W_v
  with ``num_key_value_heads`` * d_k rows each; ``o_proj`` is W_o. No tensor is fused or transposed: every
  Hugging Face matrix is already nn.Linear's (out, in);
- RoPE uses the same "rotate half" pairing (x_i, x_{i+d/2}) as :mod:`qkv.layers.positional`, so W_q and W_k
  are copied as they are (no permutation of their rows); the base is ``rope_theta``;
- the SwiGLU's ``gate_proj`` is W_g (inside silu), ``up_proj`` W_1 and ``down_proj`` W_2;
- Qwen2 keeps biases on W_q, W_k and W_v (and nowhere else); Llama and Mistral have none.

A sliding attention window (Mistral v0.1's ``sliding_window``, Qwen2's with ``use_sliding_window``) is kept as
the config's ``sliding_window`` when it is shorter than the context (a longer one hides nothing); qkv slides
one window over every layer, so a Qwen2 whose layers mix full and sliding attention is refused.

Refused with one line: RoPE scaling other than Llama 3.1's "llama3" (``rope_scaling`` / ``rope_parameters``),
a ``head_dim`` other than hidden_size / num_attention_heads, an activation other than silu, biases on the
feed-forward (``mlp_bias``) or on W_o (Llama's ``attention_bias``), and sliding attention on some layers only.

The tokenizer is the folder's tokenizer.json; bos, eos, pad and unk come from tokenizer_config.json, else
from config.json's token ids (Qwen2 has no bos).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from qkv.errors import QkvError
from qkv.io import check_readable
from qkv.models.config import ROPE_SCALING_FIELDS
from qkv.models.hf_tables import Row, convert_state_dict, flag, number, same, strip_prefix, whole, wrap_tokenizer_json
from qkv.models.llama.config import LlamaConfig
from qkv.models.llama.model import Llama
from qkv.tokenizers import HFTokenizer

WHAT = "Llama"
BLOCK = "decoder.blocks.{i}"


@dataclass(frozen=True)
class Dialect:
    """What one ``model_type`` of the Llama family says differently in config.json."""

    title: str  # how errors name the model
    qkv_bias: bool = False  # biases on W_q, W_k and W_v (Qwen2), implied: config.json has no field for them
    window_everywhere: bool = False  # a ``sliding_window`` slides over every layer (Mistral), with no layer list


DIALECTS = {"llama": Dialect("Llama"), "qwen2": Dialect("Qwen2", qkv_bias=True),
            "mistral": Dialect("Mistral", window_everywhere=True)}  # fmt: skip


def dialect(hf_config: dict[str, Any]) -> Dialect:
    """The :class:`Dialect` of a config.json (plain Llama's for a model_type the loader let through)."""
    return DIALECTS.get(hf_config.get("model_type", "llama"), Dialect(WHAT))


NAMES: list[Row] = [
    # Hugging Face name (without "model.")     qkv name                                   transform
    ("embed_tokens.weight", "embedding.token_embedding.weight", same),  # W_E
    ("layers.{i}.input_layernorm.weight", BLOCK + ".self_attn_sublayer.norm.weight", same),  # RMSNorm gain
    ("layers.{i}.self_attn.q_proj.{p}", BLOCK + ".self_attn.query.{p}", same),  # W_q (bias: Qwen2)
    ("layers.{i}.self_attn.k_proj.{p}", BLOCK + ".self_attn.key.{p}", same),  # W_k, n_kv_heads * d_k rows
    ("layers.{i}.self_attn.v_proj.{p}", BLOCK + ".self_attn.value.{p}", same),  # W_v, n_kv_heads * d_k rows
    ("layers.{i}.self_attn.o_proj.weight", BLOCK + ".self_attn.out_proj.weight", same),  # W_o
    ("layers.{i}.post_attention_layernorm.weight", BLOCK + ".ffn_sublayer.norm.weight", same),
    ("layers.{i}.mlp.gate_proj.weight", BLOCK + ".feed_forward.gate.weight", same),  # W_g, inside silu
    ("layers.{i}.mlp.up_proj.weight", BLOCK + ".feed_forward.linear1.weight", same),  # W_1
    ("layers.{i}.mlp.down_proj.weight", BLOCK + ".feed_forward.linear2.weight", same),  # W_2
    ("norm.weight", "decoder.final_norm.weight", same),
    ("lm_head.weight", "unembedding.weight", same),  # W_U (absent when tied to W_E)
]

IGNORED = [
    r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",  # RoPE's 1/base^(2i/d), stored by older checkpoints
    r"rotary_emb\.inv_freq",
]


def _refuse(what: str, field: str, value: Any, supported: str) -> QkvError:
    return QkvError(f"this {what} sets {field}={json.dumps(value)} in config.json, which qkv cannot run: {supported}")


def rope_settings(hf_config: dict[str, Any], *, what: str) -> tuple[float, dict[str, Any] | None]:
    """RoPE's base and scaling: ``rope_theta`` and ``rope_scaling`` (transformers 4), or both inside
    ``rope_parameters`` (transformers 5); base 10000 and no scaling when absent.

    Llama 3.1's "llama3" scaling is kept (:func:`qkv.layers.positional.rope_frequencies`); any other scaling
    (linear, dynamic, yarn, ...) or a RoPE per layer type is refused in one line."""
    parameters = hf_config.get("rope_parameters") or {}
    scaling = hf_config.get("rope_scaling")
    kept: dict[str, Any] | None = None
    for field, value in (("rope_scaling", scaling), ("rope_parameters", parameters)):
        if not isinstance(value, dict) or not value:
            continue
        kind = value.get("rope_type", value.get("type", "default"))
        nested = any(isinstance(v, dict) for v in value.values())  # one RoPE per layer type (transformers 5)
        if nested:
            raise _refuse(what, field, value, "qkv's Llama uses one RoPE for every layer")
        if value.get("partial_rotary_factor", 1.0) != 1.0:
            raise _refuse(what, field, value, "qkv's RoPE rotates the whole head")
        if kind == "llama3":
            kept = {"rope_type": "llama3", **{name: value.get(name) for name in ROPE_SCALING_FIELDS}}
        elif kind != "default":
            raise _refuse(what, field, value, "qkv's RoPE knows no scaling or Llama 3's (rope_type llama3)")
    bases = [
        number(place, "rope_theta", what=what)
        for place in (parameters, hf_config)
        if place.get("rope_theta") is not None
    ]  # fmt: skip  (each one checked: 0 became 10000 without a word)
    return (bases[0] if bases else 10000.0), kept


def _sliding_layers(hf_config: dict[str, Any], n_layers: int) -> int:
    """How many layers slide the window config.json gives (counted from the last)."""
    if dialect(hf_config).window_everywhere:
        return n_layers
    if isinstance(hf_config.get("layer_types"), list):  # transformers 5 names each layer's attention
        return hf_config["layer_types"].count("sliding_attention")
    if not hf_config.get("use_sliding_window", False):
        return 0
    first = hf_config.get("max_window_layers", n_layers)  # Qwen2 (transformers 4): layers from this one on slide
    return max(n_layers - first, 0)


def sliding_window(hf_config: dict[str, Any], n_layers: int, context: int, *, what: str) -> int | None:
    """The window every layer slides (``sliding_window``), or None when every layer attends to the whole context
    (no window, or one at least as long as the context). Some layers sliding and others not is refused."""
    window = hf_config.get("sliding_window")
    sliding = _sliding_layers(hf_config, n_layers) if window else 0
    if not sliding:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise _refuse(what, "sliding_window", window, "the window is a positive whole number of positions")
    if window >= context:
        return None
    if sliding < n_layers:
        raise _refuse(what, "sliding_window", window, f"qkv's Llama slides one window over every layer, and this "
                      f"model slides it over {sliding} of its {n_layers} layers")  # fmt: skip
    return window


def config_from_hf(hf_config: dict[str, Any]) -> LlamaConfig:
    """qkv's LlamaConfig for a Llama / Qwen2 / Mistral config.json (hidden_size, num_key_value_heads, ...)."""
    said = dialect(hf_config)
    what = said.title
    d_model = whole(hf_config, "hidden_size", what=what)
    n_heads = whole(hf_config, "num_attention_heads", what=what)
    n_kv_heads = whole(hf_config, "num_key_value_heads", what=what, default=n_heads)
    n_layers = whole(hf_config, "num_hidden_layers", what=what)
    context = whole(hf_config, "max_position_embeddings", what=what)
    if n_heads % n_kv_heads:
        raise QkvError(
            f"config.json's num_attention_heads={n_heads} is not divisible by num_key_value_heads={n_kv_heads} "
            "(each key/value head serves the same number of query heads): the file is damaged; download it again"
        )
    if d_model % n_heads:
        raise QkvError(
            f"config.json's hidden_size={d_model} is not divisible by num_attention_heads={n_heads}: "
            "qkv's heads are hidden_size / num_attention_heads wide; download config.json again"
        )
    head_dim = hf_config.get("head_dim")
    if head_dim is not None and head_dim != d_model // n_heads:  # (a wrong type differs too)
        raise _refuse(what, "head_dim", head_dim, f"qkv's heads are hidden_size / num_attention_heads = "
                      f"{d_model // n_heads} wide")  # fmt: skip
    activation = hf_config.get("hidden_act", "silu")
    if activation not in ("silu", "swish"):
        raise _refuse(what, "hidden_act", activation, "qkv's SwiGLU feed-forward uses silu")
    if hf_config.get("mlp_bias"):
        raise _refuse(what, "mlp_bias", True, "qkv's Llama has no biases in the feed-forward")
    if not said.qkv_bias and hf_config.get("attention_bias"):
        raise _refuse(what, "attention_bias", True, "qkv's Llama has biases only on W_q, W_k, W_v (as Qwen2), not W_o")
    window = sliding_window(hf_config, n_layers, context, what=what)
    rope_base, rope_scaling = rope_settings(hf_config, what=what)
    return LlamaConfig(
        vocab_size=whole(hf_config, "vocab_size", what=what),
        context_length=context,
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=whole(hf_config, "intermediate_size", what=what),
        layer_norm_eps=number(hf_config, "rms_norm_eps", what=what, default=1e-6),
        rope_base=rope_base,
        rope_scaling=rope_scaling,
        qkv_bias=said.qkv_bias,
        tie_embeddings=flag(hf_config, "tie_word_embeddings", what=what, default=False),
        dropout=0.0,
        attention_dropout=number(hf_config, "attention_dropout", what=what, default=0.0, positive=False, below=1.0),
        sliding_window=window,
    )


def convert_llama(hf_state_dict: dict[str, Tensor], hf_config: dict[str, Any]) -> Llama:
    """A qkv Llama holding the weights of a Llama / Qwen2 / Mistral state dict (*Model or *ForCausalLM names)."""
    model = Llama(config_from_hf(hf_config))
    what = dialect(hf_config).title
    return convert_state_dict(model, strip_prefix(hf_state_dict, "model."), NAMES, IGNORED, what=what)


convert = convert_llama


def _read_json(path: Path) -> dict[str, Any]:
    check_readable(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise QkvError(f"{path} cannot be read ({error}): download the model folder again") from None
    return data if isinstance(data, dict) else {}


def special_tokens(folder: Path, hf_config: dict[str, Any], tokenizer: HFTokenizer) -> dict[str, str | None]:
    """Each role's token: tokenizer_config.json's bos_token, eos_token, ... (a string or {"content": ...}),
    else the token of config.json's bos_token_id / eos_token_id / pad_token_id (the first of a list)."""
    settings = _read_json(folder / "tokenizer_config.json")
    roles: dict[str, str | None] = {}
    for role in ("bos", "eos", "pad", "unk"):
        token = settings.get(f"{role}_token")
        if isinstance(token, dict):
            token = token.get("content")
        if token is None and role != "unk" and f"{role}_token" not in settings:
            ids = hf_config.get(f"{role}_token_id")
            ids = ids[0] if isinstance(ids, list) and ids else ids
            token = tokenizer.hf.id_to_token(ids) if isinstance(ids, int) else None
        roles[role] = token if isinstance(token, str) and tokenizer.token_to_id(token) is not None else None
    return roles


def load_tokenizer(folder: Path, hf_config: dict[str, Any]) -> HFTokenizer:
    """The folder's tokenizer.json with the roles of :func:`special_tokens`."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise QkvError(
            f"{folder} has no tokenizer.json: qkv reads Llama and Qwen2 tokenizers from it (not from "
            "tokenizer.model); download the model's tokenizer.json into the folder"
        )
    plain = wrap_tokenizer_json(path, {})  # read once (Qwen2's file is 7 MB); the roles are found in it
    return HFTokenizer(plain.hf, special_tokens(folder, hf_config, plain))


def load_tokenizers(folder: Path, hf_config: dict[str, Any]) -> tuple[HFTokenizer, None]:
    """(tokenizer, no target tokenizer): the loader's common entry point."""
    return load_tokenizer(folder, hf_config), None
