"""Hugging Face name tables: how each family's table of rows copies a Hugging Face state dict into a qkv model.

Each family's Hugging Face module (:mod:`qkv.models.gpt.huggingface`, :mod:`qkv.models.llama.huggingface`,
:mod:`qkv.models.encoder.huggingface`, :mod:`qkv.models.transformer.huggingface`) has one table of rows
``(hf_name, qkv_name, transform)`` read top to bottom: ``{i}`` stands for a block number and ``{p}`` for
``weight`` or ``bias``; a row may feed several qkv tensors (GPT-2's fused ``c_attn`` becomes W_q, W_k and
W_v). :func:`convert_state_dict` applies a table:

- every Hugging Face tensor must match a row or the architecture's documented ignore list, else an error
  names it;
- every qkv tensor must be filled (tied tensors, such as W_U = W_E^T, by any one of their names), else
  an error names it and the Hugging Face tensor it comes from;
- every converted shape must equal the qkv shape, else an error names both tensors and both shapes.

Reading the folder (config.json, the weights) and choosing the family is :mod:`qkv.pretrained.loader`'s.
These pieces sit with the models, below the loader, because each family's folder uses them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.storage import shared_groups
from qkv.tokenizers import HFTokenizer

M = TypeVar("M", bound=nn.Module)

Transform = Callable[[Tensor], Tensor | tuple[Tensor, ...]]
Row = tuple[str, str | tuple[str, ...], Transform]

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
    model: M, hf_state: dict[str, Tensor], rows: Sequence[Row], ignored: Iterable[str], *, what: str
) -> M:
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


def wrap_tokenizer_json(path: Path, special_tokens: Mapping[str, str | None]) -> HFTokenizer:
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


REQUIRED = object()
"""The default of :func:`whole` and :func:`number` for a field config.json must have."""


def _value(hf_config: dict[str, Any], key: str, what: str, default: Any) -> Any:
    if key in hf_config and hf_config[key] is not None:
        return hf_config[key]
    if default is REQUIRED:
        raise QkvError(f"the {what} config.json lacks {key!r}: download the model's config.json again")
    return default


def _refuse_value(what: str, key: str, value: Any, must: str) -> QkvError:
    return QkvError(
        f"the {what} config.json sets {key}={json.dumps(value)}, which must be {must}: the file is damaged or was "
        "edited; download the model's config.json again"
    )


def whole(hf_config: dict[str, Any], key: str, *, what: str, default: Any = REQUIRED, low: int = 1) -> int:
    """``hf_config[key]`` as a whole number of at least ``low`` (a count, a size); a missing one is ``default``
    (or a QkvError); a string, a fraction or a number below ``low`` is a QkvError naming the field."""
    value = _value(hf_config, key, what, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _refuse_value(what, key, value, f"a whole number of at least {low}")
    return value


def number(
    hf_config: dict[str, Any], key: str, *, what: str, default: Any = REQUIRED, positive: bool = True,
    below: float | None = None,
) -> float:  # fmt: skip
    """``hf_config[key]`` as a finite number, above 0 when ``positive`` (else at least 0), and below ``below``
    when given (a probability); a missing one is ``default``; anything else is a QkvError naming the field."""
    value = _value(hf_config, key, what, default)
    fits = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    fits = fits and (value > 0 if positive else value >= 0) and (below is None or value < below)
    if not fits:
        bound = "above 0" if positive else "at least 0"
        raise _refuse_value(what, key, value, f"a finite number {bound}" + (f" and below {below}" if below else ""))
    return float(value)


def flag(hf_config: dict[str, Any], key: str, *, what: str, default: bool) -> bool:
    """``hf_config[key]`` as true or false (a missing one is ``default``); a string such as "yes" is a QkvError."""
    value = _value(hf_config, key, what, default)
    if not isinstance(value, bool):
        raise _refuse_value(what, key, value, "true or false")
    return value
