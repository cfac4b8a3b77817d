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
:func:`embed_sentences` does. A sentence-transformers folder (modules.json, 1_Pooling/config.json) says
how token vectors become one sentence vector: all-MiniLM-L6-v2 mean-pools the non-padding tokens and
L2-normalises the result (its ``Normalize`` module).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import torch.nn.functional as F
from tokenizers import decoders, models, normalizers, pre_tokenizers
from torch import Tensor

from qkv.decoding.engine import encode
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.models import Encoder, EncoderConfig, mean_pool
from qkv.pretrained.loader import Row, activation_from_hf, convert_state_dict, require, same, wrap_tokenizer_json
from qkv.tokenizers import HFTokenizer, Tokenizer

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
        vocab_size=require(hf_config, "vocab_size", what=WHAT),
        context_length=require(hf_config, "max_position_embeddings", what=WHAT),
        n_layers=require(hf_config, "num_hidden_layers", what=WHAT),
        d_model=require(hf_config, "hidden_size", what=WHAT),
        n_heads=require(hf_config, "num_attention_heads", what=WHAT),
        d_ff=require(hf_config, "intermediate_size", what=WHAT),
        activation=activation_from_hf(hf_config.get("hidden_act", "gelu"), what=WHAT),
        layer_norm_eps=hf_config.get("layer_norm_eps", 1e-12),
        dropout=hf_config.get("hidden_dropout_prob", 0.1),
        attention_dropout=hf_config.get("attention_probs_dropout_prob", 0.1),
        type_vocab_size=hf_config.get("type_vocab_size", 2),
        pad_id=hf_config.get("pad_token_id") or 0,
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


# ------------------------------------------------------------------------------------------ sentences


@dataclass(frozen=True)
class SentenceHead:
    """How sentence-transformers turns token vectors into a sentence vector."""

    pooling: str = "mean"  # "mean" over non-padding tokens, or "cls" (the [CLS] vector)
    normalize: bool = False  # L2-normalise the sentence vector (the Normalize module)
    max_tokens: int | None = None  # sentence_bert_config.json's max_seq_length ([CLS] and [SEP] included)


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise QkvError(f"{path} cannot be read ({error}): download the model folder again") from None


def read_sentence_head(folder: str | Path) -> SentenceHead:
    """The pooling, normalisation and length limit of a sentence-transformers folder (mean pooling if none)."""
    folder = Path(folder)
    if not (folder / "modules.json").is_file():
        return SentenceHead()
    pooling, normalize = "mean", False
    for module in _json(folder / "modules.json"):
        kind = str(module.get("type", ""))
        if kind.endswith(".Pooling"):
            config = _json(folder / module.get("path", "1_Pooling") / "config.json")
            modes = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
            if modes not in (["pooling_mode_mean_tokens"], ["pooling_mode_cls_token"]):
                raise QkvError(f"{folder} pools with {modes}; qkv supports mean or cls pooling: use another model")
            pooling = "mean" if modes == ["pooling_mode_mean_tokens"] else "cls"
        elif kind.endswith(".Normalize"):
            normalize = True
        elif not kind.endswith(".Transformer"):
            raise QkvError(f"{folder} has a {kind} module that qkv does not implement: use another model")
    max_tokens = None
    if (folder / "sentence_bert_config.json").is_file():
        max_tokens = _json(folder / "sentence_bert_config.json").get("max_seq_length")
    return SentenceHead(pooling=pooling, normalize=normalize, max_tokens=max_tokens)


def copy_sentence_head(source: str | Path, target: str | Path) -> None:
    """Copy the sentence-transformers files (modules.json, its module folders' JSON, sentence_bert_config.json)
    from ``source`` to ``target``, so that a converted copy of the model pools and normalises the same way."""
    from qkv.io import atomic_write_bytes

    source, target = Path(source), Path(target)
    if not (source / "modules.json").is_file():
        return
    files = [Path("modules.json"), Path("sentence_bert_config.json")]
    for module in _json(source / "modules.json"):
        folder = str(module.get("path", ""))
        if folder and (source / folder).is_dir():
            files += [path.relative_to(source) for path in (source / folder).glob("*.json")]
    for file in files:
        if (source / file).is_file():
            atomic_write_bytes(target / file, (source / file).read_bytes())


def encode_for_bert(tokenizer: Tokenizer, texts: list[str], *, max_tokens: int) -> tuple[Tensor, Tensor]:
    """``[CLS] text [SEP]`` ids of each text, cut to ``max_tokens``, right-padded with [PAD]: (ids, padding_mask).

    Both tensors are (B, T); the mask is True at padding, as qkv's models expect.
    """
    return pad_rows(bert_rows(tokenizer, texts, max_tokens=max_tokens), tokenizer)


def bert_rows(tokenizer: Tokenizer, texts: list[str], *, max_tokens: int) -> list[list[int]]:
    """``[CLS] text [SEP]`` ids of each text, cut to ``max_tokens`` (keeping the final [SEP])."""
    rows = tokenizer.encode_batch(list(texts), add_bos=True, add_eos=True)
    return [r if len(r) <= max_tokens else r[: max_tokens - 1] + r[-1:] for r in rows]


def pad_rows(rows: list[list[int]], tokenizer: Tokenizer) -> tuple[Tensor, Tensor]:
    """Right-pad ``rows`` with [PAD] to the longest: (ids, padding_mask), both (B, T), True at padding."""
    length = max(len(r) for r in rows)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    ids = torch.tensor([r + [pad] * (length - len(r)) for r in rows])  # (B, T)
    padding_mask = torch.tensor([[False] * len(r) + [True] * (length - len(r)) for r in rows])  # (B, T)
    return ids, padding_mask


def length_batches(lengths: list[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices of the rows, sorted by length and cut into batches of at most ``max_batch_tokens`` padded tokens.

    Rows of similar length share a batch, so little padding is computed; a row longer than the budget
    gets a batch of its own.
    """
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        batch = batches[-1] if batches else None
        if batch and (len(batch) + 1) * lengths[index] <= max_batch_tokens:
            batch.append(index)
        else:
            batches.append([index])
    return batches


@torch.no_grad()
def embed_sentences(
    bundle: ModelBundle,
    texts: list[str],
    *,
    head: SentenceHead | None = None,
    max_batch_tokens: int | None = None,
    engine: str = "auto",
) -> Tensor:
    """Sentence vectors (B, d_model) of ``texts``, as sentence-transformers computes them.

    ``head`` defaults to the one the model folder describes (:func:`read_sentence_head`). The texts run in
    batches of similar length of at most ``max_batch_tokens`` tokens (padding included), so memory stays
    bounded for any number of texts and little padding is computed (as sentence-transformers sorts by length).
    The default is 1,024 tokens on a CPU, where a batch's activations then stay in cache (docs/pretrained.md
    gives the measurement), and 16,384 on a GPU.
    The vectors come back in the order of ``texts``. ``engine`` "model" runs the model's own forward; the
    default runs the inference pass of :mod:`qkv.decoding.encoder_pass` (the same numbers, faster).
    """
    model = bundle.model
    if not isinstance(model, Encoder):
        raise QkvError(f"sentence embeddings need an encoder model, not a {type(model).__name__}: load a BERT")
    weight = next(model.parameters())
    if max_batch_tokens is None:
        max_batch_tokens = 1024 if weight.device.type == "cpu" else 16384
    if max_batch_tokens < 1:
        raise QkvError(f"max_batch_tokens must be at least 1, not {max_batch_tokens}")
    head = head or read_sentence_head(bundle.path)
    limit = min(head.max_tokens or model.config.context_length, model.config.context_length)
    rows = bert_rows(bundle.tokenizer, texts, max_tokens=limit)
    vectors = torch.empty(len(rows), model.config.d_model, device=weight.device, dtype=weight.dtype)
    for batch in length_batches([len(r) for r in rows], max_batch_tokens):
        ids, padding_mask = pad_rows([rows[i] for i in batch], bundle.tokenizer)
        ids, padding_mask = ids.to(weight.device), padding_mask.to(weight.device)
        hidden = encode(model, ids, padding_mask, engine=engine)  # (b, T, d_model)
        vectors[batch] = mean_pool(hidden, padding_mask) if head.pooling == "mean" else hidden[:, 0]
    return F.normalize(vectors, dim=-1) if head.normalize else vectors
