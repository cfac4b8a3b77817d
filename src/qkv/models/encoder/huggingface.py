"""BERT and MiniLM (e.g. sentence-transformers/all-MiniLM-L6-v2) as qkv's :class:`~qkv.models.Encoder`.

BERT (Devlin et al. 2018) is an encoder-only Transformer: W_E (``word_embeddings``) + learned positions
(``position_embeddings``) + segment embeddings (``token_type_embeddings``), a LayerNorm over that sum,
then N post-LN blocks (``encoder.layer.{i}``: self-attention with W_q, W_k, W_v = ``query``, ``key``,
``value`` and W_o = ``attention.output.dense``, residual, LayerNorm; FFN ``intermediate.dense`` (W_1,
GELU) and ``output.dense`` (W_2), residual, LayerNorm). It has no unembedding W_U; the [CLS] ``pooler``
and the pre-training heads (``cls.*``) are not part of qkv's Encoder and are skipped.

Tokens are WordPiece pieces (tokenizer.json, or vocab.txt), and every input is ``[CLS] text [SEP]``:
qkv's tokenizers add no special tokens by themselves, so the roles are bos = [CLS], eos = [SEP] (plus
pad = [PAD], unk = [UNK]) and texts are encoded with ``add_bos=True, add_eos=True``, as
:func:`qkv.pretrained.sentences.embed_sentences` does (sentence-transformers' pooling lives there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers
from torch import Tensor

from qkv.errors import QkvError
from qkv.models.encoder.config import EncoderConfig
from qkv.models.encoder.model import Encoder
from qkv.models.hf_tables import Row, activation_from_hf, convert_state_dict, number, same, whole, wrap_tokenizer_json
from qkv.tokenizers import HFTokenizer

WHAT = "BERT"
LAYER = "encoder.layer.{i}"
BLOCK = "encoder.blocks.{i}"
ROLES = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}

NAMES: list[Row] = [
    # Hugging Face name (without "bert.")             qkv name                                transform
    ("embeddings.word_embeddings.weight", "embedding.token_embedding.weight", same),  # W_E
    ("embeddings.position_embeddings.weight", "embedding.positional_encoding.weight", same),
    ("embeddings.token_type_embeddings.weight", "token_type_embedding.weight", same),  # segments A/B
    ("embeddings.LayerNorm.{p}", "embedding_norm.{p}", same),
    (LAYER + ".attention.self.query.{p}", BLOCK + ".self_attn.query.{p}", same),  # W_q
    (LAYER + ".attention.self.key.{p}", BLOCK + ".self_attn.key.{p}", same),  # W_k
    (LAYER + ".attention.self.value.{p}", BLOCK + ".self_attn.value.{p}", same),  # W_v
    (LAYER + ".attention.output.dense.{p}", BLOCK + ".self_attn.out_proj.{p}", same),  # W_o
    (LAYER + ".attention.output.LayerNorm.{p}", BLOCK + ".attn_sublayer.norm.{p}", same),
    (LAYER + ".intermediate.dense.{p}", BLOCK + ".feed_forward.linear1.{p}", same),  # W_1
    (LAYER + ".output.dense.{p}", BLOCK + ".feed_forward.linear2.{p}", same),  # W_2
    (LAYER + ".output.LayerNorm.{p}", BLOCK + ".ffn_sublayer.norm.{p}", same),
]

IGNORED = [
    r"embeddings\.position_ids",  # the buffer arange(max_len) of older checkpoints
    r"pooler\..*",  # tanh(W h_[CLS]) for next-sentence prediction; not a token vector
    r"cls\..*",  # pre-training heads: masked-LM (cls.predictions) and next-sentence (cls.seq_relationship)
]


def config_from_hf(hf_config: dict[str, Any]) -> EncoderConfig:
    """qkv's EncoderConfig for a BERT config.json (hidden_size, num_hidden_layers, num_attention_heads, ...)."""
    position_type = hf_config.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise QkvError(f"this BERT uses {position_type!r} positions; qkv imports absolute ones only: use another model")
    return EncoderConfig(
        vocab_size=whole(hf_config, "vocab_size", what=WHAT),
        context_length=whole(hf_config, "max_position_embeddings", what=WHAT),
        n_layers=whole(hf_config, "num_hidden_layers", what=WHAT),
        d_model=whole(hf_config, "hidden_size", what=WHAT),
        n_heads=whole(hf_config, "num_attention_heads", what=WHAT),
        d_ff=whole(hf_config, "intermediate_size", what=WHAT),
        activation=activation_from_hf(hf_config.get("hidden_act", "gelu"), what=WHAT),
        layer_norm_eps=number(hf_config, "layer_norm_eps", what=WHAT, default=1e-12),
        dropout=number(hf_config, "hidden_dropout_prob", what=WHAT, default=0.1, positive=False, below=1.0),
        attention_dropout=number(
            hf_config, "attention_probs_dropout_prob", what=WHAT, default=0.1, positive=False, below=1.0
        ),  # fmt: skip
        type_vocab_size=whole(hf_config, "type_vocab_size", what=WHAT, default=2),
        pad_id=whole(hf_config, "pad_token_id", what=WHAT, default=0, low=0),
        norm_first=False,
        final_norm=False,
        embedding_norm=True,
        positional="learned",
        bias=True,
        tie_embeddings=False,
    )


def _modern_names(hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Drop the "bert." prefix of BertFor* models; old LayerNorm names gamma/beta become weight/bias."""
    out = {}
    for name, tensor in hf_state.items():
        name = name.removeprefix("bert.")
        if name.endswith(".gamma"):
            name = name.removesuffix(".gamma") + ".weight"
        elif name.endswith(".beta"):
            name = name.removesuffix(".beta") + ".bias"
        out[name] = tensor
    return out


def convert_bert(hf_state_dict: dict[str, Tensor], hf_config: dict[str, Any]) -> Encoder:
    """A qkv Encoder holding the weights of a BERT state dict (BertModel or BertFor* names)."""
    model = Encoder(config_from_hf(hf_config))
    return convert_state_dict(model, _modern_names(hf_state_dict), NAMES, IGNORED, what=WHAT)


convert = convert_bert


def _do_lower_case(folder: Path) -> bool:
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            return bool(json.loads(path.read_text(encoding="utf-8")).get("do_lower_case", True))
        except (OSError, ValueError, AttributeError):
            pass
    return True


def load_tokenizer(folder: Path) -> HFTokenizer:
    """WordPiece from tokenizer.json, or from vocab.txt (lower-cased unless tokenizer_config.json says not)."""
    if (folder / "tokenizer.json").is_file():
        return wrap_tokenizer_json(folder / "tokenizer.json", ROLES)
    vocab = folder / "vocab.txt"
    if not vocab.is_file():
        raise QkvError(f"{folder} has no BERT tokenizer (tokenizer.json or vocab.txt): download it")
    try:
        hf = tokenizers.Tokenizer(models.WordPiece.from_file(str(vocab), unk_token="[UNK]"))
    except Exception as error:  # the tokenizers library raises bare Exceptions
        raise QkvError(f"vocab.txt in {folder} cannot be read ({error}): download it again") from None
    hf.normalizer = normalizers.BertNormalizer(lowercase=_do_lower_case(folder))
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.decoder = decoders.WordPiece(prefix="##")
    specials = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if hf.token_to_id(t) is not None]
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    return HFTokenizer(hf, {role: t for role, t in ROLES.items() if t in specials})


def load_tokenizers(folder: Path, hf_config: dict[str, Any]) -> tuple[HFTokenizer, None]:
    """(tokenizer, no target tokenizer): the loader's common entry point."""
    return load_tokenizer(folder), None
