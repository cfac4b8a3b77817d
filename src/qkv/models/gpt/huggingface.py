"""GPT-2 (gpt2, gpt2-medium, gpt2-large, gpt2-xl, distilgpt2) as qkv's :class:`~qkv.models.GPT`.

GPT-2 (Radford et al. 2019) is a decoder-only language model: token embedding W_E (``wte``) plus learned
positions (``wpe``), N pre-LN blocks (``h.{i}``: LayerNorm ``ln_1`` -> causal self-attention ``attn`` ->
residual, LayerNorm ``ln_2`` -> MLP ``mlp`` with the tanh-approximated GELU ("gelu_new") -> residual), a
final LayerNorm ``ln_f``, and the unembedding W_U (``lm_head``) tied to W_E. Two storage quirks:

- its linear layers are ``Conv1D`` modules that keep W as (in, out), so each matrix is transposed into
  nn.Linear's (out, in);
- ``c_attn`` is one fused projection [W_q | W_k | W_v] of width 3 d_model, split into qkv's separate
  ``query``, ``key`` and ``value`` projections; ``c_proj`` of the attention is W_o (``out_proj``).

The tokenizer is byte-level BPE, from tokenizer.json or built from vocab.json + merges.txt, with
``<|endoftext|>`` as both bos and eos and no pad or unk token (every byte has a token).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers
from torch import Tensor

from qkv.errors import QkvError
from qkv.models.gpt.config import GPTConfig
from qkv.models.gpt.model import GPT
from qkv.models.hf_tables import (
    Row,
    activation_from_hf,
    convert_state_dict,
    flag,
    fused_qkv_bias,
    fused_qkv_conv1d,
    number,
    same,
    strip_prefix,
    transposed,
    whole,
    wrap_tokenizer_json,
)
from qkv.tokenizers import HFTokenizer

WHAT = "GPT-2"
BLOCK = "decoder.blocks.{i}"
ENDOFTEXT = "<|endoftext|>"

NAMES: list[Row] = [
    # Hugging Face name (without "transformer.")  qkv name                                  transform
    ("wte.weight", "embedding.token_embedding.weight", same),  # W_E
    ("wpe.weight", "embedding.positional_encoding.weight", same),  # learned positions
    ("h.{i}.ln_1.{p}", BLOCK + ".self_attn_sublayer.norm.{p}", same),
    (
        "h.{i}.attn.c_attn.weight",  # [W_q | W_k | W_v], Conv1D
        (BLOCK + ".self_attn.query.weight", BLOCK + ".self_attn.key.weight", BLOCK + ".self_attn.value.weight"),
        fused_qkv_conv1d,
    ),
    (
        "h.{i}.attn.c_attn.bias",
        (BLOCK + ".self_attn.query.bias", BLOCK + ".self_attn.key.bias", BLOCK + ".self_attn.value.bias"),
        fused_qkv_bias,
    ),
    ("h.{i}.attn.c_proj.weight", BLOCK + ".self_attn.out_proj.weight", transposed),  # W_o
    ("h.{i}.attn.c_proj.bias", BLOCK + ".self_attn.out_proj.bias", same),
    ("h.{i}.ln_2.{p}", BLOCK + ".ffn_sublayer.norm.{p}", same),
    ("h.{i}.mlp.c_fc.weight", BLOCK + ".feed_forward.linear1.weight", transposed),  # W_1
    ("h.{i}.mlp.c_fc.bias", BLOCK + ".feed_forward.linear1.bias", same),
    ("h.{i}.mlp.c_proj.weight", BLOCK + ".feed_forward.linear2.weight", transposed),  # W_2
    ("h.{i}.mlp.c_proj.bias", BLOCK + ".feed_forward.linear2.bias", same),
    ("ln_f.{p}", "decoder.final_norm.{p}", same),
    ("lm_head.weight", "unembedding.weight", same),  # W_U, tied to W_E (usually not stored at all)
]

IGNORED = [
    r"h\.\d+\.attn\.bias",  # the causal mask, stored as a buffer by older checkpoints (qkv builds its own)
    r"h\.\d+\.attn\.masked_bias",  # the -1e4 fill value for that mask, same
]


def config_from_hf(hf_config: dict[str, Any]) -> GPTConfig:
    """qkv's GPTConfig for a GPT-2 config.json (n_layer, n_embd, n_head, n_positions, vocab_size, ...)."""
    for key, unsupported in (
        ("add_cross_attention", True),
        ("scale_attn_weights", False),
        ("scale_attn_by_inverse_layer_idx", True),
    ):
        if hf_config.get(key) == unsupported:
            raise QkvError(f"this GPT-2 sets {key}={unsupported}, which qkv's GPT lacks: use another model")
    d_model = whole(hf_config, "n_embd", what=WHAT)
    return GPTConfig(
        vocab_size=whole(hf_config, "vocab_size", what=WHAT),
        context_length=whole(hf_config, "n_positions", what=WHAT),
        n_layers=whole(hf_config, "n_layer", what=WHAT),
        d_model=d_model,
        n_heads=whole(hf_config, "n_head", what=WHAT),
        d_ff=whole(hf_config, "n_inner", what=WHAT, default=4 * d_model),
        activation=activation_from_hf(hf_config.get("activation_function", "gelu_new"), what=WHAT),
        layer_norm_eps=number(hf_config, "layer_norm_epsilon", what=WHAT, default=1e-5),
        dropout=number(hf_config, "resid_pdrop", what=WHAT, default=0.1, positive=False, below=1.0),
        attention_dropout=number(hf_config, "attn_pdrop", what=WHAT, default=0.1, positive=False, below=1.0),
        norm_first=True,
        final_norm=True,
        positional="learned",
        bias=True,
        tie_embeddings=flag(hf_config, "tie_word_embeddings", what=WHAT, default=True),
    )


def convert_gpt2(hf_state_dict: dict[str, Tensor], hf_config: dict[str, Any]) -> GPT:
    """A qkv GPT holding the weights of a GPT-2 state dict (GPT2Model or GPT2LMHeadModel names)."""
    model = GPT(config_from_hf(hf_config))
    state = strip_prefix(hf_state_dict, "transformer.")
    return convert_state_dict(model, state, NAMES, IGNORED, what=WHAT)


convert = convert_gpt2


def load_tokenizer(folder: Path) -> HFTokenizer:
    """GPT-2's byte-level BPE: tokenizer.json, or vocab.json + merges.txt; bos = eos = <|endoftext|>."""
    roles = {"bos": ENDOFTEXT, "eos": ENDOFTEXT}
    if (folder / "tokenizer.json").is_file():
        return wrap_tokenizer_json(folder / "tokenizer.json", roles)
    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    if not (vocab.is_file() and merges.is_file()):
        raise QkvError(f"{folder} has no GPT-2 tokenizer (tokenizer.json, or vocab.json and merges.txt): download it")
    try:
        hf = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as error:  # the tokenizers library raises bare Exceptions
        raise QkvError(f"vocab.json/merges.txt in {folder} cannot be read ({error}): download them again") from None
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    if hf.token_to_id(ENDOFTEXT) is not None:
        hf.add_special_tokens([tokenizers.AddedToken(ENDOFTEXT, special=True, normalized=False)])
    else:
        roles = {}
    return HFTokenizer(hf, roles)


def load_tokenizers(folder: Path, hf_config: dict[str, Any]) -> tuple[HFTokenizer, None]:
    """(tokenizer, no target tokenizer): the loader's common entry point."""
    return load_tokenizer(folder), None
