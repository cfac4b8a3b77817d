"""Sentence vectors from an encoder, as sentence-transformers computes them (e.g. all-MiniLM-L6-v2).

A sentence-transformers folder (modules.json, 1_Pooling/config.json) says how token vectors become one
sentence vector: all-MiniLM-L6-v2 mean-pools the non-padding tokens and L2-normalises the result (its
``Normalize`` module). Every input is ``[CLS] text [SEP]``: qkv's tokenizers add no special tokens by
themselves, so texts are encoded with ``add_bos=True, add_eos=True`` (bos = [CLS], eos = [SEP], the roles
:mod:`qkv.models.encoder.huggingface` gives BERT's tokens). The texts run through the inference pass of
:mod:`qkv.decoding.encoder_pass` in batches of similar length.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv.decoding.sessions import encode
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle
from qkv.models.encoder.config import EncoderConfig
from qkv.models.encoder.model import mean_pool
from qkv.models.family import ENCODER, family_of
from qkv.tokenizers import Tokenizer


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
    step: str = "auto",
) -> Tensor:
    """Sentence vectors (B, d_model) of ``texts``, as sentence-transformers computes them.

    ``head`` defaults to the one the model folder describes (:func:`read_sentence_head`). The texts run in
    batches of similar length of at most ``max_batch_tokens`` tokens (padding included), so memory stays
    bounded for any number of texts and little padding is computed (as sentence-transformers sorts by length).
    The default is 1,024 tokens on a CPU, where a batch's activations then stay in cache (docs/pretrained.md
    gives the measurement), and 16,384 on a GPU.
    The vectors come back in the order of ``texts``. ``step`` "model" runs the model's own forward; the
    default runs the inference pass of :mod:`qkv.decoding.encoder_pass` (the same numbers, faster).
    """
    model = bundle.model
    family = family_of(model)
    if family.role != ENCODER:
        raise QkvError(f"sentence embeddings need an encoder model, and this is {family.title}: load a BERT")
    weight = next(model.parameters())
    if max_batch_tokens is None:
        max_batch_tokens = 1024 if weight.device.type == "cpu" else 16384
    if max_batch_tokens < 1:
        raise QkvError(f"max_batch_tokens must be at least 1, not {max_batch_tokens}")
    head = head or read_sentence_head(bundle.path)
    config = cast(EncoderConfig, model.config)  # the role check above: an encoder's
    limit = min(head.max_tokens or config.context_length, config.context_length)
    rows = bert_rows(bundle.tokenizer, texts, max_tokens=limit)
    vectors = torch.empty(len(rows), config.d_model, device=weight.device, dtype=weight.dtype)
    for batch in length_batches([len(r) for r in rows], max_batch_tokens):
        ids, padding_mask = pad_rows([rows[i] for i in batch], bundle.tokenizer)
        ids, padding_mask = ids.to(weight.device), padding_mask.to(weight.device)
        hidden = encode(model, ids, padding_mask, step=step)  # (b, T, d_model)
        vectors[batch] = mean_pool(hidden, padding_mask) if head.pooling == "mean" else hidden[:, 0]
    return F.normalize(vectors, dim=-1) if head.normalize else vectors
