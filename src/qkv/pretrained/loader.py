"""Reading a Hugging Face model folder and copying its tensors into a qkv model, name by name.

A Hugging Face folder holds ``config.json`` (the architecture: ``model_type`` plus its sizes) and the
weights: ``model.safetensors``, a sharded ``model.safetensors.index.json`` with its shards, or the older
``pytorch_model.bin``, which is read with ``torch.load(weights_only=True)`` so that no pickled code can run.

Each architecture module (:mod:`~qkv.pretrained.gpt2`, :mod:`~qkv.pretrained.bert`,
:mod:`~qkv.pretrained.marian`, :mod:`~qkv.pretrained.llama`) has one table of rows
``(hf_name, qkv_name, transform)`` read top to bottom: ``{i}`` stands for a block number and ``{p}`` for
``weight`` or ``bias``; a row may feed several qkv tensors (GPT-2's fused ``c_attn`` becomes W_q, W_k and
W_v). :func:`convert_state_dict` applies a table:

- every Hugging Face tensor must match a row or the architecture's documented ignore list, else an error
  names it;
- every qkv tensor must be filled (tied tensors, such as W_U = W_E^T, by any one of their names), else
  an error names it and the Hugging Face tensor it comes from;
- every converted shape must equal the qkv shape, else an error names both tensors and both shapes.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv.chat_templates.source import hf_folder_template
from qkv.errors import QkvError
from qkv.model_dir import ModelBundle, save_model_dir
from qkv.pretrained.hub import resolve_model_dir
from qkv.storage import read_tensors, shared_groups
from qkv.tokenizers import HFTokenizer

Transform = Callable[[Tensor], Tensor | tuple[Tensor, ...]]
Row = tuple[str, str | tuple[str, ...], Transform]

ARCHITECTURES = {
    "gpt2": "qkv.pretrained.gpt2",
    "bert": "qkv.pretrained.bert",
    "marian": "qkv.pretrained.marian",
    "llama": "qkv.pretrained.llama",
    "qwen2": "qkv.pretrained.llama",
    "mistral": "qkv.pretrained.llama",
}
"""config.json's ``model_type`` -> the module that converts it (Llama, Qwen2 and Mistral share one table)."""


# ------------------------------------------------------------------------------------------ transforms


def same(t: Tensor) -> Tensor:
    """The tensor as it is."""
    return t


def transposed(t: Tensor) -> Tensor:
    """GPT-2's Conv1D stores W as (in, out); nn.Linear stores (out, in)."""
    return t.t()


def fused_qkv_conv1d(t: Tensor) -> tuple[Tensor, ...]:
    """GPT-2's c_attn weight (d, 3d) = [W_q | W_k | W_v] as a Conv1D -> three (d, d) nn.Linear weights."""
    if t.dim() != 2 or t.shape[1] % 3:
        raise ValueError("expected a (d_model, 3 * d_model) matrix")
    return tuple(w.t() for w in t.chunk(3, dim=1))


def fused_qkv_bias(t: Tensor) -> tuple[Tensor, ...]:
    """GPT-2's c_attn bias (3d,) = [b_q; b_k; b_v] -> three (d,) biases."""
    if t.dim() != 1 or t.shape[0] % 3:
        raise ValueError("expected a (3 * d_model,) vector")
    return t.chunk(3)


def first_row(t: Tensor) -> Tensor:
    """Marian's final_logits_bias is stored as (1, vocab); qkv's logits bias is (vocab,)."""
    return t.reshape(-1)


# ------------------------------------------------------------------------------------------ reading


def read_hf_config(folder: Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder as a dict; a missing or broken file is a QkvError."""
    path = folder / "config.json"
    if not path.is_file():
        raise QkvError(
            f"{folder} has no config.json: pass the folder of a Hugging Face model (config.json with the "
            "weights and tokenizer files)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise QkvError(f"config.json in {folder} cannot be read ({error}): download the model again") from None
    if not isinstance(data, dict):
        raise QkvError(f"config.json in {folder} is not a JSON object: download the model again")
    return data


def _read_bin(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: never runs pickled code
    except Exception as error:
        detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise QkvError(
            f"{path.name} in {path.parent} cannot be read as plain tensors ({detail}): use the model's "
            "safetensors weights, or download the file again"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise QkvError(f"{path.name} in {path.parent} is not a state dict of tensors: use the model's safetensors")
    return state


def _read_shards(index: Path, read: Callable[[Path], dict[str, Tensor]]) -> dict[str, Tensor]:
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise QkvError(f"{index.name} in {index.parent} is damaged ({error}): download the model again") from None
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if not (index.parent / shard).is_file():
            raise QkvError(f"{index.parent} lacks the shard {shard} listed in {index.name}: download it too")
        state.update(read(index.parent / shard))
    return state


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    return read_tensors(path, fix="download the model again")[0]


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """All tensors of a Hugging Face folder, by their Hugging Face names (safetensors preferred)."""
    if (folder / "model.safetensors").is_file():
        return _read_safetensors(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        return _read_shards(folder / "model.safetensors.index.json", _read_safetensors)
    if (folder / "pytorch_model.bin").is_file():
        return _read_bin(folder / "pytorch_model.bin")
    if (folder / "pytorch_model.bin.index.json").is_file():
        return _read_shards(folder / "pytorch_model.bin.index.json", _read_bin)
    raise QkvError(
        f"{folder} has no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin): "
        "download them into the folder"
    )


# ------------------------------------------------------------------------------------------ mapping


def _pattern(template: str) -> re.Pattern[str]:
    regex = re.escape(template).replace(r"\{i\}", r"(?P<i>\d+)").replace(r"\{p\}", r"(?P<p>weight|bias)")
    return re.compile(regex)


def _fill(template: str, match: re.Match[str]) -> str:
    return template.format(**match.groupdict())


def _targets(row: Row) -> tuple[str, ...]:
    return (row[1],) if isinstance(row[1], str) else row[1]


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def hf_name_for(qkv_name: str, rows: Sequence[Row]) -> str | None:
    """The Hugging Face tensor that a table turns into ``qkv_name`` (for error messages)."""
    for row in rows:
        for target in _targets(row):
            match = _pattern(target).fullmatch(qkv_name)
            if match:
                return _fill(row[0], match)
    return None


def map_state_dict(
    hf_state: dict[str, Tensor], rows: Sequence[Row], ignored: Iterable[str], *, what: str
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Apply a table: qkv name -> tensor, and qkv name -> the Hugging Face name it came from.

    ``ignored`` holds regular expressions of Hugging Face names that are deliberately not used.
    """
    compiled = [(_pattern(row[0]), _targets(row), row[2]) for row in rows]
    skip = [re.compile(p) for p in ignored]
    out: dict[str, Tensor] = {}
    source: dict[str, str] = {}
    unknown: list[str] = []
    for name, tensor in hf_state.items():
        for pattern, targets, transform in compiled:
            match = pattern.fullmatch(name)
            if match is None:
                continue
            try:
                converted = transform(tensor)
            except ValueError as error:
                raise QkvError(
                    f"{what} tensor {name} has shape {_shape(tensor)}, which cannot be converted ({error}): "
                    "the weights do not match config.json; download the model again"
                ) from None
            converted = (converted,) if isinstance(converted, Tensor) else converted
            for target, value in zip(targets, converted, strict=True):
                qkv_name = _fill(target, match)
                if qkv_name in out and not (out[qkv_name].shape == value.shape and torch.equal(out[qkv_name], value)):
                    raise QkvError(
                        f"{what} tensors {source[qkv_name]} and {name} differ, but both become qkv {qkv_name}: "
                        "set share_encoder_decoder_embeddings / tie_word_embeddings to false in config.json"
                    )
                out[qkv_name] = value
                source[qkv_name] = name
            break
        else:
            if not any(p.fullmatch(name) for p in skip):
                unknown.append(name)
    if unknown:
        shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
        raise QkvError(
            f"the {what} weights hold tensors qkv does not know ({shown}): this checkpoint has parts the "
            f"{what} architecture does not; check config.json's model_type"
        )
    return out, source


def convert_state_dict(
    model: nn.Module, hf_state: dict[str, Tensor], rows: Sequence[Row], ignored: Iterable[str], *, what: str
) -> nn.Module:
    """Copy ``hf_state`` into ``model`` through the table ``rows`` (see the module docstring); return the model."""
    mapped, source = map_state_dict(hf_state, rows, ignored, what=what)
    state = model.state_dict()
    extra = sorted(set(mapped) - set(state))
    if extra:
        raise QkvError(
            f"{what} tensor {source[extra[0]]} becomes qkv {extra[0]}, which the model built from config.json "
            "does not have: config.json does not match the weights (e.g. the number of layers)"
        )
    loaded: dict[str, Tensor] = {}
    for group in shared_groups(state):
        present = [name for name in group if name in mapped]
        if not present:
            hf = hf_name_for(group[0], rows)
            raise QkvError(
                f"the {what} weights lack {hf or 'a tensor'} (qkv {group[0]}, shape {_shape(state[group[0]])}): "
                "the checkpoint is incomplete or of another architecture; download it again"
            )
        first = present[0]
        for other in present[1:]:
            if mapped[other].shape != mapped[first].shape or not torch.equal(mapped[other], mapped[first]):
                raise QkvError(
                    f"{what} tensors {source[first]} and {source[other]} differ, but qkv ties {first} and {other}: "
                    "set tie_word_embeddings to false in config.json"
                )
        for name in group:
            want, got = _shape(state[name]), _shape(mapped[first])
            if want != got:
                raise QkvError(
                    f"{what} tensor {source[first]} gives shape {got} but qkv {name} needs {want}: the weights do "
                    "not match config.json (hidden size, vocabulary or layers); download the model again"
                )
            loaded[name] = mapped[first].to(state[name].dtype)
    with torch.no_grad():
        model.load_state_dict(loaded, strict=True)
    return model


def wrap_tokenizer_json(path: Path, special_tokens: dict[str, str | None]) -> HFTokenizer:
    """A Hugging Face tokenizer.json as qkv's HFTokenizer, without the file's fixed padding or truncation.

    (all-MiniLM-L6-v2's file, for one, pads every text to 128 tokens; qkv pads batches itself.)
    """
    tokenizer = HFTokenizer.from_file(path, special_tokens)
    tokenizer.hf.no_padding()
    tokenizer.hf.no_truncation()
    return tokenizer


def strip_prefix(hf_state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """Names without ``prefix`` (e.g. "transformer." of GPT2LMHeadModel, "bert." of BertForMaskedLM)."""
    return {name.removeprefix(prefix): tensor for name, tensor in hf_state.items()}


def activation_from_hf(name: str, *, what: str) -> str:
    """qkv's name for a Hugging Face ``activation_function`` / ``hidden_act``."""
    table = {
        "gelu": "gelu",
        "gelu_new": "gelu_tanh",
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_fast": "gelu_tanh",
        "relu": "relu",
        "silu": "silu",
        "swish": "silu",
    }
    if name not in table:
        raise QkvError(f"{what} activation {name!r} is not supported: qkv has {', '.join(sorted(set(table)))}")
    return table[name]


def require(hf_config: dict[str, Any], key: str, *, what: str) -> Any:
    """``hf_config[key]``, or a QkvError naming the missing field."""
    if key not in hf_config:
        raise QkvError(f"the {what} config.json lacks {key!r}: download the model's config.json again")
    return hf_config[key]


# ------------------------------------------------------------------------------------------ public API


def readable_architectures() -> list[str]:
    """The Hugging Face ``architectures`` qkv imports, from the model families (:func:`qkv.models.family.families`)."""
    from qkv.models.family import families

    return [name for family in families().values() for name in family.hf_architectures]


def architecture(hf_config: dict[str, Any], folder: Path | str = "the model folder") -> Any:
    """The converter module for config.json's ``model_type``; unknown types are a QkvError."""
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES:
        named = hf_config.get("architectures")
        shown = repr(model_type) + (f" ({', '.join(map(str, named))})" if isinstance(named, list) and named else "")
        raise QkvError(
            f"{folder} holds a {shown} model (config.json's model_type), which qkv cannot import: qkv reads "
            f"{', '.join(readable_architectures())}"
        )
    return importlib.import_module(ARCHITECTURES[model_type])


def load_pretrained(name_or_path: str | Path, *, device: str | torch.device = "cpu") -> ModelBundle:
    """Load a Hugging Face model (local folder, or Hub name when online) as a qkv model with its tokenizer(s).

    The architecture comes from config.json's ``model_type`` (gpt2, bert, marian, llama, qwen2, mistral).
    config.json is checked before the weights are read, so a model qkv cannot run costs no loading time.
    The chat template, if the folder has one, comes along (:func:`qkv.chat_templates.source.hf_folder_template`).
    A folder saved by qkv itself (config.json with a "model" field) is loaded with
    :func:`qkv.model_dir.load_model_dir`.
    """
    folder = resolve_model_dir(name_or_path)
    hf_config = read_hf_config(folder)
    if "model" in hf_config and "model_type" not in hf_config:
        from qkv.model_dir import load_model_dir

        return load_model_dir(folder, device=device)
    module = architecture(hf_config, folder)
    try:
        module.config_from_hf(hf_config)
    except QkvError as error:
        raise QkvError(f"{folder}: {error}") from None
    model = module.convert(read_hf_weights(folder), hf_config)
    tokenizer, target_tokenizer = module.load_tokenizers(folder, hf_config)
    model.to(device)
    model.eval()
    return ModelBundle(
        model=model,
        config=model.config,
        tokenizer=tokenizer,
        target_tokenizer=target_tokenizer,
        path=folder,
        chat_template=hf_folder_template(folder),
    )


def save_as_qkv(bundle: ModelBundle, out_dir: str | Path) -> Path:
    """Write a loaded model in qkv's own folder format (reload it with :func:`qkv.model_dir.load_model_dir`)."""
    return save_model_dir(
        out_dir, bundle.model, bundle.tokenizer, bundle.target_tokenizer, chat_template=bundle.chat_template
    )
