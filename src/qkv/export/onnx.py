"""ONNX export: a qkv model as graphs that ONNX Runtime (or any ONNX engine) runs without PyTorch.

Each model becomes graphs whose inputs and outputs are plain tensors (names as below; B batch, T new
tokens, P positions already read, S source tokens, h heads, d_k = d_model / h):

- **GPT**, one file: ``input_ids`` (B, T) and, for every layer i, ``past_key_i`` / ``past_value_i``
  (B, h, P, d_k) in; ``logits`` (B, T, vocab) and ``present_key_i`` / ``present_value_i`` (B, h, P + T, d_k)
  out. P = 0 (empty pasts) reads a prompt; then each step feeds one token and the presents back
  (:mod:`qkv.export.past`). The rows of a batch share one length (there is no padding mask).
- **Encoder**, one file: ``input_ids`` and ``attention_mask`` (B, T; 1 at tokens, 0 at padding, as in
  Hugging Face) in; ``last_hidden_state`` (B, T, d_model) and ``sentence_embedding`` (B, d_model, pooled
  and normalised as ``qkv embed`` does) out.
- **Encoder-decoder**, two files, ``NAME.encoder.onnx`` and ``NAME.decoder.onnx``. The encoder runs once
  per batch of sentences and the decoder once per target token, so each graph holds only the work of its
  step; one graph would have to rerun the encoder at every token, or branch on the step inside the graph.
  The encoder takes ``input_ids`` and ``attention_mask`` (B, S) and returns ``cross_key_i`` /
  ``cross_value_i`` (B, h, S, d_k), the keys and values its output gives every decoder layer's
  cross-attention; the decoder takes ``input_ids`` (B, T), ``encoder_attention_mask`` (B, S), the pasts and
  the cross keys and values, and returns ``logits`` and the presents.

Every file records the model's config.json, its role and the export it belongs to in its metadata
(``qkv.config``, ``qkv.graph``, ``qkv.export``: one id shared by the files of one export, so that an encoder
and a decoder of two exports are never run together). The files are traced first, written into a hidden
folder beside them, and only then moved into place, one rename each; an existing file is refused unless
``overwrite`` (``qkv export --force``) is given.
The graphs come from ``torch.onnx.export`` (the torch.export-based exporter, which needs ``onnxscript``),
traced with gradients on so that each layer takes its general path (the eager decoding shortcuts are for
PyTorch on the CPU). :mod:`qkv.export.onnx_runtime` runs them: greedy generation, translation and
embedding, checked against qkv in the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.export.past import PastKeyValues
from qkv.io import check_writable, writing
from qkv.layers.attention import MultiHeadAttention
from qkv.models import GPT, Encoder, Transformer, mean_pool
from qkv.models.config import BaseConfig
from qkv.models.family import ENCODER, LANGUAGE_MODEL, TRANSLATOR, WORD_VECTORS, family_of
from qkv.models.transformer.config import TransformerConfig
from qkv.quantization import is_quantized, quantization_scheme, weight_bytes

EXAMPLE_BATCH, EXAMPLE_LENGTH, EXAMPLE_PAST = 2, 3, 2  # tracing shapes; 0 and 1 would be specialised
MIN_CONTEXT = EXAMPLE_LENGTH + EXAMPLE_PAST
SINGLE_FILE_LIMIT = 1_500_000_000  # bytes of weights above which they go to a .data file beside (protobuf: 2 GB)


def _pairs(tensors: tuple[Tensor, ...]) -> list[tuple[Tensor, Tensor]]:
    return list(zip(tensors[0::2], tensors[1::2], strict=True))


def _padding(attention_mask: Tensor) -> Tensor:
    return attention_mask == 0  # (B, T) True at padding, as qkv's models take it


class GPTGraph(nn.Module):
    """GPT with its KV cache as inputs and outputs: (input_ids, k_0, v_0, ...) -> (logits, k'_0, v'_0, ...)."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        cache = PastKeyValues(_pairs(past))
        logits = self.model(input_ids, cache=cache)  # (B, T, vocab)
        return (logits, *cache.presents())


class EncoderGraph(nn.Module):
    """Encoder: (input_ids, attention_mask) -> (last_hidden_state, sentence_embedding)."""

    def __init__(self, model: Encoder, *, pooling: str = "mean", normalize: bool = False) -> None:
        super().__init__()
        self.model, self.pooling, self.normalize = model, pooling, normalize

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        padding = _padding(attention_mask)
        hidden = self.model(input_ids, padding_mask=padding)  # (B, T, d_model)
        pooled = mean_pool(hidden, padding) if self.pooling == "mean" else hidden[:, 0]  # (B, d_model)
        return hidden, F.normalize(pooled, dim=-1) if self.normalize else pooled


class TranslatorEncoderGraph(nn.Module):
    """Encoder half: (input_ids, attention_mask) -> each decoder layer's cross-attention keys and values."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, ...]:
        memory = self.model.encode(input_ids, src_padding_mask=_padding(attention_mask))  # (B, S, d_model)
        out: list[Tensor] = []
        for block in self.model.decoder.blocks:
            attention = cast(MultiHeadAttention, block.cross_attn)  # a decoder block of an encoder-decoder has one
            out += [attention.split_heads(attention.key(memory)), attention.split_heads(attention.value(memory))]
        return tuple(out)  # (B, h_kv, S, d_k) each: what MultiHeadAttention keeps in a static cache


class TranslatorDecoderGraph(nn.Module):
    """Decoder half: (input_ids, encoder_attention_mask, pasts..., crosses...) -> (logits, presents...)."""

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = model
        self.n_layers = len(model.decoder.blocks)

    def forward(self, input_ids: Tensor, encoder_attention_mask: Tensor, *caches: Tensor) -> tuple[Tensor, ...]:
        past, cross = caches[: 2 * self.n_layers], caches[2 * self.n_layers :]
        cache = PastKeyValues(_pairs(past), _pairs(cross))
        unused = input_ids.new_empty(0)  # the static cross caches stand in for the encoder output
        logits = self.model.decode(
            input_ids,
            unused,
            memory_padding_mask=_padding(encoder_attention_mask),
            cache=cache,  # type: ignore[arg-type]
        )
        return (logits, *cache.presents())


# --------------------------------------------------------------------------------------------- export


def _cache_names(prefix: str, n_layers: int) -> list[str]:
    return [f"{prefix}_{kind}_{i}" for i in range(n_layers) for kind in ("key", "value")]


def _config(model: nn.Module) -> BaseConfig:
    """The exported model's config: a Transformer's (:func:`check_exportable` refuses the other families)."""
    return cast(BaseConfig, model.config)


def _empty_like_cache(model: nn.Module, batch: int, length: int) -> list[Tensor]:
    config = _config(model)
    assert config.n_kv_heads is not None  # filled from n_heads by BaseConfig.__post_init__
    return [torch.zeros(batch, config.n_kv_heads, length, config.head_dim) for _ in range(2)]  # h_kv heads


@contextlib.contextmanager
def _tracing(model: nn.Module) -> Iterator[None]:
    """Gradients on but no parameter requiring one (general layer paths, no autograd functions), quietly."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        logger.setLevel(logging.ERROR)
        with torch.enable_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        for p, flag in flags:
            p.requires_grad_(flag)


def _export(
    graph: nn.Module,
    args: tuple[Tensor, ...],
    names: tuple[list[str], list[str]],
    dims: tuple[Any, ...],  # one entry per forward argument; a tuple of them for the *caches
    path: Path,
    metadata: dict[str, str],
) -> tuple[Any, Path, bool]:
    """Trace ``graph``; return what :func:`_save_all` writes: the ONNX program, its path, and whether its
    weights go to a .data file beside it."""
    graph.eval()
    with _tracing(graph):
        try:
            program = torch.onnx.export(
                graph, args, dynamo=True, input_names=names[0], output_names=names[1], dynamic_shapes=dims
            )
        except Exception as error:  # the exporter's errors are long; the first line says what failed
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise QkvError(
                f"torch.onnx could not export this {type(graph).__name__} ({detail[:300]}): please report it "
                "with the model's config.json"
            ) from None
    assert program is not None  # dynamo=True always returns the program
    program.model.metadata_props.update(metadata)
    return program, path, weight_bytes(graph) > SINGLE_FILE_LIMIT


def _save_all(traced: list[tuple[Any, Path, bool]]) -> list[Path]:
    """Write every traced graph into a hidden folder beside its path (under its own name, so that a .data
    file of external weights is named after it), then move them all into place: a kill leaves the old files
    or the new ones, and a pair mixed by a kill between two renames is caught by its export ids."""
    from qkv.data.leftovers import make_work_folder, remove_stale_work_folders

    first = traced[0][1]
    with writing(first):  # a read-only folder, a full disk: one line naming the file
        remove_stale_work_folders(first, "exporting")
        work, owner = make_work_folder(first, "exporting")
        try:
            for program, path, external in traced:
                program.save(str(work / path.name), external_data=external)
            written = sorted(p for p in work.iterdir() if p.name != ".owner")
            for file in written:
                with open(file, "rb+") as handle:  # the bytes reach the disk before the renames make them visible
                    os.fsync(handle.fileno())
                os.chmod(file, 0o644)
            for file in written:
                os.replace(file, first.parent / file.name)
            return [path for _, path, _ in traced]
        finally:
            shutil.rmtree(work, ignore_errors=True)
            owner.close()


def output_paths(model: nn.Module, path: str | Path) -> list[Path]:
    """The files :func:`export_onnx` writes for ``model``: ``path``, or NAME.encoder.onnx and NAME.decoder.onnx
    for an encoder-decoder."""
    path = Path(path)
    if family_of(model).role == TRANSLATOR:
        return [path.with_suffix(".encoder.onnx"), path.with_suffix(".decoder.onnx")]
    return [path]


def check_free(paths: list[Path], overwrite: bool) -> None:
    """QkvError when one of ``paths`` exists and ``overwrite`` is off, or is a folder."""
    for path in paths:
        if path.is_dir():
            raise QkvError(f"--out {path} is a folder: give a file name ending in .onnx")
        if path.exists() and not overwrite:
            raise QkvError(f"{path} already exists: add --force to replace it, or choose another --out")
        check_writable(path)  # before tracing, which takes a minute for GPT-2


def check_exportable(model: nn.Module, path: Path, *, overwrite: bool = True) -> None:
    """QkvError unless ``model`` can be exported to ``path`` (exporter installed, .onnx name, float weights, ...)."""
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise QkvError(f"ONNX export needs {' and '.join(missing)}: pip install -e '.[onnx]'")
    if path.suffix != ".onnx":
        raise QkvError(f"--out {path} should end in .onnx (the encoder-decoder writes NAME.encoder.onnx too)")
    if is_quantized(model):
        raise QkvError(
            f"this model holds {quantization_scheme(model)} weights (qkv quantize), which qkv does not export to "
            "ONNX: export the float run it was quantized from (onnxruntime.quantization can quantize the ONNX file)"
        )
    family = family_of(model)
    if family.role == WORD_VECTORS or not family.has("residual stream"):  # the graphs are built from blocks
        raise QkvError(
            f"qkv exports Transformer language models, encoders and encoder-decoders to ONNX, not {family.title}"
        )
    if _config(model).context_length < MIN_CONTEXT:
        raise QkvError(
            f"a context of {_config(model).context_length} positions is too short to export: the exporter traces "
            f"{MIN_CONTEXT} positions; use a model with context_length >= {MIN_CONTEXT}"
        )
    check_free(output_paths(model, path), overwrite)


def export_onnx(
    model: nn.Module, path: str | Path, *, pooling: str = "mean", normalize: bool = False, overwrite: bool = False
) -> list[Path]:
    """Write ``model`` (GPT, Encoder or Transformer, float weights) as ONNX graphs; return the files written.

    ``path`` ends in .onnx. A GPT or an encoder is one file, ``path``; an encoder-decoder is two, ``path``
    with the suffix .encoder.onnx and .decoder.onnx. ``pooling`` and ``normalize`` set how an encoder's
    ``sentence_embedding`` is made (:func:`qkv.pretrained.sentences.read_sentence_head` reads them from a
    sentence-transformers folder). The model is moved to the CPU and traced there. Existing files are a
    QkvError unless ``overwrite``.
    """
    path = Path(path)
    check_exportable(model, path, overwrite=overwrite)
    model = model.cpu().eval()
    meta = {"qkv.config": json.dumps(_config(model).to_dict()), "qkv.export": uuid.uuid4().hex}
    role = family_of(model).role
    if role == LANGUAGE_MODEL:
        return _save_all([_export_gpt(cast(GPT, model), path, meta)])
    if role == ENCODER:
        return _save_all([_export_encoder(cast(Encoder, model), path, meta, pooling, normalize)])
    return _save_all(_export_translator(cast(Transformer, model), path, meta))


_SEQ = {0: "batch", 1: "sequence"}  # the dynamic axes of input_ids (B, T) and of what follows its T
_CACHE_DIMS = {0: "batch", 2: "past_sequence"}  # of a past or present key/value (B, h_kv, P, d_k)


def _export_gpt(model: GPT, path: Path, meta: dict[str, str]) -> tuple[Any, Path, bool]:
    """The one graph of a language model: tokens and a KV cache in, logits and the grown cache out."""
    n = model.config.n_layers
    ids = torch.zeros(EXAMPLE_BATCH, EXAMPLE_LENGTH, dtype=torch.long)
    pasts = [t for _ in range(n) for t in _empty_like_cache(model, EXAMPLE_BATCH, EXAMPLE_PAST)]
    return _export(
        GPTGraph(model),
        (ids, *pasts),
        (["input_ids", *_cache_names("past", n)], ["logits", *_cache_names("present", n)]),
        (_SEQ, (_CACHE_DIMS,) * 2 * n),
        path,
        {**meta, "qkv.graph": "gpt"},
    )


def _export_encoder(
    model: Encoder, path: Path, meta: dict[str, str], pooling: str, normalize: bool
) -> tuple[Any, Path, bool]:
    """The one graph of an encoder: tokens and their mask in, hidden states and the pooled sentence vector out."""
    ids = torch.zeros(EXAMPLE_BATCH, EXAMPLE_LENGTH, dtype=torch.long)
    mask = torch.ones(EXAMPLE_BATCH, EXAMPLE_LENGTH, dtype=torch.long)
    return _export(
        EncoderGraph(model, pooling=pooling, normalize=normalize),
        (ids, mask),
        (["input_ids", "attention_mask"], ["last_hidden_state", "sentence_embedding"]),
        (_SEQ, _SEQ),
        path,
        {**meta, "qkv.graph": "encoder", "qkv.pooling": pooling, "qkv.normalize": str(normalize).lower()},
    )


def _export_translator(model: Transformer, path: Path, meta: dict[str, str]) -> list[tuple[Any, Path, bool]]:
    """An encoder-decoder's two graphs: the encoder's (source in, every layer's cross keys and values out) and
    the decoder's (target tokens, pasts and crosses in; logits and presents out), each naming the other."""
    n = cast(TransformerConfig, model.config).n_decoder_layers
    batch, length = EXAMPLE_BATCH, EXAMPLE_LENGTH
    ids = torch.zeros(batch, length, dtype=torch.long)
    mask = torch.ones(batch, length, dtype=torch.long)
    encoder_path, decoder_path = output_paths(model, path)
    src = {0: "batch", 1: "source_sequence"}
    cross_dims = {0: "batch", 2: "source_sequence"}
    encoder = _export(
        TranslatorEncoderGraph(model),
        (ids, mask),
        (["input_ids", "attention_mask"], _cache_names("cross", n)),
        (src, src),
        encoder_path,
        {**meta, "qkv.graph": "translator-encoder", "qkv.decoder": decoder_path.name},
    )
    pasts = [t for _ in range(n) for t in _empty_like_cache(model, batch, EXAMPLE_PAST)]
    crosses = [t for _ in range(n) for t in _empty_like_cache(model, batch, length + 1)]
    decoder = _export(
        TranslatorDecoderGraph(model),
        (ids, torch.ones(batch, length + 1, dtype=torch.long), *pasts, *crosses),
        (
            ["input_ids", "encoder_attention_mask", *_cache_names("past", n), *_cache_names("cross", n)],
            ["logits", *_cache_names("present", n)],
        ),
        (_SEQ, src, (_CACHE_DIMS,) * 2 * n + (cross_dims,) * 2 * n),
        decoder_path,
        {**meta, "qkv.graph": "translator-decoder", "qkv.encoder": encoder_path.name},
    )
    return [encoder, decoder]


def sentence_head_of(bundle: Any) -> dict[str, Any]:
    """``pooling`` and ``normalize`` for :func:`export_onnx` from a loaded encoder's folder (mean, no norm if none)."""
    from qkv.pretrained.sentences import read_sentence_head

    head = read_sentence_head(bundle.path)
    return {"pooling": head.pooling, "normalize": head.normalize}
