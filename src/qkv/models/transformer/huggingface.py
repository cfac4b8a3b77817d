"""Marian / OPUS-MT translation models (MarianMTModel, e.g. Helsinki-NLP/opus-mt-en-de) as qkv's Transformer.

Marian is the paper's encoder-decoder, post-LN, with: token embeddings W_E (``shared``) used by both the
encoder and the decoder and tied to the unembedding W_U (``lm_head``), multiplied by sqrt(d_model)
(``scale_embedding``); fixed sinusoidal positions laid out as [sin | cos] halves rather than interleaved
(qkv's ``sinusoidal_interleaved=False``; the stored ``embed_positions`` tables are checked against
qkv's and otherwise not used); the SiLU ("swish") activation; a bias on the output logits
(``final_logits_bias``); and no final LayerNorm. Each encoder layer has self-attention (``q_proj``,
``k_proj``, ``v_proj``, ``out_proj`` = W_q, W_k, W_v, W_o) and an FFN (``fc1`` = W_1, ``fc2`` = W_2), each
followed by residual + LayerNorm; decoder layers add cross-attention (``encoder_attn``) in between.
The decoder starts from ``<pad>`` (Marian's decoder_start_token_id), so the target tokenizer's bos role
is ``<pad>``: ``greedy_decode(..., bos_id=tgt.bos_id, eos_id=tgt.eos_id)`` translates as Marian does.

Tokens come from two SentencePiece models, ``source.spm`` and ``target.spm``, whose pieces map to ids
through ONE shared ``vocab.json``. Each .spm file is converted (its protobuf read directly, no
``sentencepiece`` needed) into a ``tokenizers`` Unigram model over the vocab.json ids, with the
SentencePiece normaliser (precompiled charsmap) and whitespace handling, wrapped in qkv's HFTokenizer.
Pieces of vocab.json that the side's .spm lacks keep their ids but get a score so low that they are
never preferred to that side's own pieces. Encode sources with ``add_eos=True`` (Marian appends
``</s>``). Not reproduced: the Moses punctuation normalisation Hugging Face applies when ``sacremoses``
is installed, and SentencePiece's byte fallback (Marian models do not use it).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tokenizers
import torch
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers
from torch import Tensor

from qkv.errors import QkvError
from qkv.layers.positional import sinusoidal_table
from qkv.models.hf_tables import (
    Row,
    activation_from_hf,
    convert_state_dict,
    first_row,
    flag,
    number,
    same,
    strip_prefix,
    whole,
)
from qkv.models.transformer.config import TransformerConfig
from qkv.models.transformer.model import Transformer
from qkv.tokenizers import HFTokenizer

WHAT = "Marian"
ENC, QENC = "encoder.layers.{i}", "encoder.blocks.{i}"
DEC, QDEC = "decoder.layers.{i}", "decoder.blocks.{i}"


def _attention(hf: str, qkv: str) -> list[Row]:
    """Rows of one attention module: q_proj, k_proj, v_proj, out_proj -> query, key, value, out_proj."""
    return [
        (f"{hf}.q_proj.{{p}}", f"{qkv}.query.{{p}}", same),  # W_q
        (f"{hf}.k_proj.{{p}}", f"{qkv}.key.{{p}}", same),  # W_k
        (f"{hf}.v_proj.{{p}}", f"{qkv}.value.{{p}}", same),  # W_v
        (f"{hf}.out_proj.{{p}}", f"{qkv}.out_proj.{{p}}", same),  # W_o
    ]


NAMES: list[Row] = [
    # Hugging Face name (without "model.")  qkv name                                transform
    ("encoder.embed_tokens.weight", "src_embedding.token_embedding.weight", same),  # W_E (source side)
    ("decoder.embed_tokens.weight", "tgt_embedding.token_embedding.weight", same),  # W_E (target side)
    ("lm_head.weight", "unembedding.weight", same),  # W_U, tied to W_E
    ("final_logits_bias", "unembedding.bias", first_row),  # (1, vocab) -> (vocab,)
    *_attention(ENC + ".self_attn", QENC + ".self_attn"),
    (ENC + ".self_attn_layer_norm.{p}", QENC + ".attn_sublayer.norm.{p}", same),
    (ENC + ".fc1.{p}", QENC + ".feed_forward.linear1.{p}", same),  # W_1
    (ENC + ".fc2.{p}", QENC + ".feed_forward.linear2.{p}", same),  # W_2
    (ENC + ".final_layer_norm.{p}", QENC + ".ffn_sublayer.norm.{p}", same),
    *_attention(DEC + ".self_attn", QDEC + ".self_attn"),
    (DEC + ".self_attn_layer_norm.{p}", QDEC + ".self_attn_sublayer.norm.{p}", same),
    *_attention(DEC + ".encoder_attn", QDEC + ".cross_attn"),
    (DEC + ".encoder_attn_layer_norm.{p}", QDEC + ".cross_attn_sublayer.norm.{p}", same),
    (DEC + ".fc1.{p}", QDEC + ".feed_forward.linear1.{p}", same),
    (DEC + ".fc2.{p}", QDEC + ".feed_forward.linear2.{p}", same),
    (DEC + ".final_layer_norm.{p}", QDEC + ".ffn_sublayer.norm.{p}", same),
]

IGNORED = [
    r"(encoder|decoder)\.embed_positions\.weight",  # the fixed sinusoidal table: checked, then rebuilt by qkv
    r"shared\.weight",  # stands in for encoder/decoder.embed_tokens when those are not stored (see convert_marian)
]


def _same_value(hf_config: dict[str, Any], a: str, b: str, default: Any) -> Any:
    value = whole(hf_config, a, what=WHAT, default=default)
    if whole(hf_config, b, what=WHAT, default=default) != value:
        raise QkvError(
            f"this Marian model has {a}={value} but {b}={hf_config.get(b)}; qkv's Transformer uses one value "
            "for both stacks: use another model"
        )
    return value


def config_from_hf(hf_config: dict[str, Any]) -> TransformerConfig:
    """qkv's TransformerConfig for a Marian config.json (d_model, encoder_layers, decoder_layers, ...)."""
    for key in ("normalize_before", "normalize_embedding", "add_final_layer_norm"):  # keys of older configs
        if hf_config.get(key):
            raise QkvError(f"this Marian model sets {key}, which qkv's post-LN Transformer lacks: use another model")
    tied = flag(hf_config, "tie_word_embeddings", what=WHAT, default=True)
    # Hugging Face (5.x) shares W_E between encoder and decoder only while tie_word_embeddings is true.
    one_vocab = flag(hf_config, "share_encoder_decoder_embeddings", what=WHAT, default=True)
    shared = one_vocab and tied
    vocab = whole(hf_config, "vocab_size", what=WHAT)
    target_vocab = vocab if one_vocab else whole(hf_config, "decoder_vocab_size", what=WHAT, default=vocab)
    return TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=target_vocab,
        context_length=whole(hf_config, "max_position_embeddings", what=WHAT, default=1024),
        n_encoder_layers=whole(hf_config, "encoder_layers", what=WHAT, default=12),
        n_decoder_layers=whole(hf_config, "decoder_layers", what=WHAT, default=12),
        d_model=whole(hf_config, "d_model", what=WHAT, default=1024),
        n_heads=_same_value(hf_config, "encoder_attention_heads", "decoder_attention_heads", 16),
        d_ff=_same_value(hf_config, "encoder_ffn_dim", "decoder_ffn_dim", 4096),
        activation=activation_from_hf(hf_config.get("activation_function", "gelu"), what=WHAT),
        dropout=number(hf_config, "dropout", what=WHAT, default=0.1, positive=False, below=1.0),
        attention_dropout=number(hf_config, "attention_dropout", what=WHAT, default=0.0, positive=False, below=1.0),
        scale_embeddings=flag(hf_config, "scale_embedding", what=WHAT, default=False),
        share_embeddings=shared,
        tie_embeddings=tied,
        final_logits_bias=True,
        pad_id=whole(hf_config, "pad_token_id", what=WHAT, default=58100, low=0),
        norm_first=False,
        final_norm=False,
        layer_norm_eps=1e-5,
        positional="sinusoidal",
        sinusoidal_interleaved=False,
        bias=True,
    )


def convert_marian(hf_state_dict: dict[str, Tensor], hf_config: dict[str, Any]) -> Transformer:
    """A qkv Transformer holding the weights of a MarianMTModel (or MarianModel) state dict."""
    config = config_from_hf(hf_config)
    state = strip_prefix(hf_state_dict, "model.")
    for side in ("encoder", "decoder"):  # checkpoints store the shared W_E once, usually as "shared.weight"
        if f"{side}.embed_tokens.weight" not in state and "shared.weight" in state:
            state[f"{side}.embed_tokens.weight"] = state["shared.weight"]
    if "final_logits_bias" not in state:  # Hugging Face treats a missing one as zeros
        state["final_logits_bias"] = torch.zeros(1, config.tgt_vocab_size)
    table = sinusoidal_table(config.context_length, config.d_model, interleaved=False)
    for side in ("encoder", "decoder"):
        stored = state.get(f"{side}.embed_positions.weight")
        if stored is not None and (stored.shape != table.shape or not torch.allclose(stored.float(), table, atol=1e-4)):
            raise QkvError(
                f"Marian tensor model.{side}.embed_positions.weight is not the [sin | cos] table qkv rebuilds "
                f"(shape {list(stored.shape)} vs {list(table.shape)}): check max_position_embeddings and d_model"
            )
    return convert_state_dict(Transformer(config), state, NAMES, IGNORED, what=WHAT)


convert = convert_marian


# ------------------------------------------------------------------------------------------ SentencePiece

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # SentencePiece piece types
UNIGRAM = 1


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, Any]]:
    """(field number, value) of a protobuf message: ints for varints, bytes for everything else."""
    pos = 0
    value: int | bytes
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos : pos + size], pos + size
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value, pos = data[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield number, value


def read_spm(path: Path) -> dict[str, Any]:
    """The parts of a SentencePiece model (sentencepiece_model.proto) a tokenizer needs.

    Returns pieces [(piece, score, type)], model_type, precompiled_charsmap, add_dummy_prefix and
    remove_extra_whitespaces (field numbers as in sentencepiece_model.proto).
    """
    out: dict[str, Any] = dict(
        pieces=[], model_type=UNIGRAM, precompiled_charsmap=b"", add_dummy_prefix=True, remove_extra_whitespaces=True
    )
    try:
        for number, value in _fields(path.read_bytes()):
            if number == 1:  # ModelProto.pieces
                piece = dict(_fields(value))
                score = struct.unpack("<f", piece[2])[0] if 2 in piece else 0.0
                out["pieces"].append((piece.get(1, b"").decode("utf-8"), score, piece.get(3, NORMAL)))
            elif number == 2:  # ModelProto.trainer_spec
                out["model_type"] = dict(_fields(value)).get(3, UNIGRAM)
            elif number == 3:  # ModelProto.normalizer_spec
                spec = dict(_fields(value))
                out["precompiled_charsmap"] = spec.get(2, b"")
                out["add_dummy_prefix"] = bool(spec.get(3, 1))
                out["remove_extra_whitespaces"] = bool(spec.get(4, 1))
    except (OSError, ValueError, IndexError, KeyError, struct.error, UnicodeDecodeError) as error:
        raise QkvError(f"{path} is not a SentencePiece model ({error}): download the model folder again") from None
    if not out["pieces"]:
        raise QkvError(f"{path} holds no SentencePiece pieces: download the model folder again")
    return out


def spm_tokenizer(spm_path: Path, vocab: dict[str, int], special_tokens: dict[str, str | None]) -> HFTokenizer:
    """One side's SentencePiece model over the shared vocab.json ids, as a ``tokenizers`` Unigram model."""
    spm = read_spm(spm_path)
    if spm["model_type"] != UNIGRAM:
        raise QkvError(f"{spm_path} is not a unigram SentencePiece model; qkv converts unigram ones (as Marian uses)")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise QkvError("vocab.json's ids are not 0..n-1 without gaps: download the model's vocab.json again")
    scores = {piece: score for piece, score, kind in spm["pieces"] if kind in (NORMAL, USER_DEFINED)}
    never = min(scores.values(), default=0.0) - 1000.0  # below any real segmentation: pieces of the other side
    by_id = sorted(vocab.items(), key=lambda item: item[1])
    unk = vocab.get("<unk>")
    hf = tokenizers.Tokenizer(models.Unigram([(p, scores.get(p, never)) for p, _ in by_id], unk_id=unk))
    steps: list[normalizers.Normalizer] = (
        [normalizers.Precompiled(spm["precompiled_charsmap"])] if spm["precompiled_charsmap"] else []
    )
    if spm["remove_extra_whitespaces"]:  # as Hugging Face's SentencePiece converter does
        steps += [normalizers.Strip(left=False, right=True), normalizers.Replace(Regex(" {2,}"), "▁")]
    hf.normalizer = normalizers.Sequence(steps)
    prepend = "always" if spm["add_dummy_prefix"] else "never"
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend)
    hf.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend)
    specials = sorted({t for t in special_tokens.values() if t is not None})
    hf.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in specials])
    codes = [p for p in vocab if p.startswith(">>") and p.endswith("<<")]  # target-language codes, e.g. >>fra<<
    hf.add_tokens([tokenizers.AddedToken(c, special=False, normalized=False) for c in codes])
    return HFTokenizer(hf, special_tokens)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise QkvError(f"{path} cannot be read ({error}): download the model folder again") from None


def load_tokenizers(folder: Path, hf_config: dict[str, Any]) -> tuple[HFTokenizer, HFTokenizer]:
    """(source tokenizer, target tokenizer) from source.spm, target.spm and vocab.json."""
    missing = [name for name in ("source.spm", "target.spm", "vocab.json") if not (folder / name).is_file()]
    if missing:
        raise QkvError(f"{folder} lacks the Marian tokenizer files {missing}: download them into the folder")
    vocab = _read_json(folder / "vocab.json")
    target_vocab = vocab
    config = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if config.get("separate_vocabs"):
        target_vocab = _read_json(folder / "target_vocab.json")

    def roles(vocab: dict[str, int]) -> dict[str, str | None]:
        names: dict[int | None, str] = {i: p for p, i in vocab.items()}  # a missing id (None) finds the default
        start = hf_config.get("decoder_start_token_id", hf_config.get("pad_token_id"))
        eos = hf_config.get("eos_token_id", vocab.get("</s>"))
        return {"pad": "<pad>", "bos": names.get(start, "<pad>"), "eos": names.get(eos, "</s>"), "unk": "<unk>"}

    source = spm_tokenizer(folder / "source.spm", vocab, roles(vocab))
    target = spm_tokenizer(folder / "target.spm", target_vocab, roles(target_vocab))
    return source, target
