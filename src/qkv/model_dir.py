"""The saved form of a model: a folder with ``config.json``, ``tokenizer.json`` and ``model.safetensors``.

This is the Hugging Face layout, and every part of qkv that reads or writes a model goes through it
(training, generation, the pretrained importers, the server)::

    runs/shakespeare/
      config.json             model.config.to_dict(): {"model": "gpt", "d_model": 128, ...}
      tokenizer.json          Tokenizer.save(): the vocabulary (the rows of W_E, in order)
      tokenizer_target.json   encoder-decoder models with a separate target vocabulary only
      model.safetensors       every weight, by its state_dict name ("decoder.blocks.0.self_attn.query.weight")
      quantization.json       quantized models only (:mod:`qkv.quantization`): which layers hold int8 / int4 weights
      chat_template.jinja     a chat model's Jinja chat template (:mod:`qkv.chat_templates`), when it has one

The tensors go in and out of model.safetensors through :mod:`qkv.storage` (shared tensors stored once, no
pickle); which tokenizers a model has and which config fields they size come from its family
(:func:`qkv.models.family.family_of`). Opening any model (this folder, a Hugging Face folder, a Hub name)
is :func:`qkv.load`.

A quantized model (``qkv quantize``) is the same folder: its int8 layers store ``qweight`` (int8) and
``weight_scale`` instead of ``weight`` (int4 layers: ``qweight``, ``weight_scale`` and ``weight_min``), the header
says ``"quantization": "int8"`` (or ``"int4"``), and ``quantization.json`` names the quantized layers, so that
loading builds them before copying the weights in (no original needed).

Every write is atomic (a temporary file, then a rename), so an interrupted save never leaves a half-written
file behind, and every problem with the files is a :class:`~qkv.errors.QkvError` naming the file and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from qkv import storage
from qkv.errors import QkvError
from qkv.io import atomic_write_text, read_json, read_text, writing
from qkv.models.config import ModelConfig
from qkv.models.family import build_model, family_of
from qkv.models.memory import check_fits
from qkv.quantization import apply_quantization, quantization_info, quantization_scheme
from qkv.storage import (
    MODEL_FILE,
    QUANTIZATION_FILE,
    damaged_error,
    read_tensors,
    save_tensors,
    shared_groups,
    unwrap_model,
)
from qkv.tokenizers import Tokenizer, load_tokenizer

__all__ = [
    "CHAT_TEMPLATE_FILE",
    "CONFIG_FILE",
    "MODEL_FILE",
    "QUANTIZATION_FILE",
    "TARGET_TOKENIZER_FILE",
    "TOKENIZER_FILE",
    "ModelBundle",
    "build_model",
    "check_vocab",
    "damaged_error",
    "load_config",
    "load_model_dir",
    "load_weights",
    "read_chat_template",
    "read_tensors",
    "save_model_dir",
    "save_tensors",
    "save_weights",
    "shared_groups",
    "unwrap_model",
]

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TARGET_TOKENIZER_FILE = "tokenizer_target.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # the name Hugging Face folders use too


def save_weights(model: nn.Module, path: str | Path, *, state: dict[str, Tensor] | None = None) -> None:
    """:func:`qkv.storage.save_weights`, with the header naming the scheme of the model's quantized layers, if any."""
    storage.save_weights(model, path, state=state, quantization=quantization_scheme(unwrap_model(model)))


def load_weights(
    model: nn.Module, path: str | Path, *, device: str | torch.device | None = None, fix: str | None = None
) -> nn.Module:
    """:func:`qkv.storage.load_weights`, checking that the file holds quantized weights (of the same scheme)
    exactly when the model has quantized layers."""
    scheme = quantization_scheme(unwrap_model(model))
    return storage.load_weights(model, path, device=device, fix=fix, quantization=scheme)


@dataclass
class ModelBundle:
    """Everything loaded from a model folder: the model (eval mode), its config, its tokenizer(s)."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None
    path: Path
    chat_template: str | None = None  # the model's own Jinja chat template (GGUF metadata, tokenizer_config.json)


def _vocab_checks(config: ModelConfig, has_target: bool) -> list[tuple[str, str]]:
    """(tokenizer file, config field) pairs whose sizes must agree: the family's vocabulary fields, the
    second one (a translator's target) sized by tokenizer_target.json when there is one."""
    files = (TOKENIZER_FILE, TARGET_TOKENIZER_FILE if has_target else TOKENIZER_FILE)
    return list(zip(files, family_of(config).vocab_fields, strict=False))


def check_vocab(
    config: ModelConfig, tokenizer: Tokenizer, target_tokenizer: Tokenizer | None, directory: str | Path
) -> None:
    """Raise QkvError unless the tokenizer(s) have as many tokens as the config's embedding has rows."""
    if target_tokenizer is not None and not family_of(config).two_vocabularies:
        raise QkvError(f"{family_of(config).title} has one vocabulary: drop the target tokenizer")
    tokenizers = {TOKENIZER_FILE: tokenizer, TARGET_TOKENIZER_FILE: target_tokenizer}
    for file, field in _vocab_checks(config, target_tokenizer is not None):
        have, want = tokenizers[file].vocab_size, getattr(config, field)  # type: ignore[union-attr]
        if have != want:
            raise QkvError(
                f"{file} has {have} tokens but {CONFIG_FILE} says {field}={want}: the files come from "
                f"different runs; put the tokenizer the model was trained with in {directory}"
            )


def save_model_dir(
    directory: str | Path,
    model: nn.Module,
    tokenizer: Tokenizer,
    target_tokenizer: Tokenizer | None = None,
    *,
    weights_name: str | None = MODEL_FILE,
    state: dict[str, Tensor] | None = None,
    chat_template: str | None = None,
) -> Path:
    """Write config.json, tokenizer.json (+ tokenizer_target.json), the weights (+ quantization.json for an
    int8 model, chat_template.jinja for a ``chat_template``: a bundle's own) into ``directory``.

    The weights go first and config.json last, each atomically, so the folder only looks like a finished
    model once every file is in place. ``weights_name=None`` writes no weights (a run that has only begun).
    ``state`` replaces ``model.state_dict()`` (see :func:`save_weights`).
    """
    directory = Path(directory)
    model = unwrap_model(model)
    config = getattr(model, "config", None)
    if not isinstance(config, ModelConfig):
        raise TypeError(f"{type(model).__name__} has no qkv config (model.config); build it with build_model()")
    check_vocab(config, tokenizer, target_tokenizer, directory)
    with writing(directory):
        directory.mkdir(parents=True, exist_ok=True)
    if weights_name is not None:
        save_weights(model, directory / weights_name, state=state)
    tokenizer.save(directory / TOKENIZER_FILE)
    if target_tokenizer is not None:
        target_tokenizer.save(directory / TARGET_TOKENIZER_FILE)
    else:
        (directory / TARGET_TOKENIZER_FILE).unlink(missing_ok=True)  # a stale one would pair with this model
    if chat_template is not None:
        atomic_write_text(directory / CHAT_TEMPLATE_FILE, chat_template)
    else:
        (directory / CHAT_TEMPLATE_FILE).unlink(missing_ok=True)  # a stale one would pair with this model
    quantization = quantization_info(model)
    if quantization is not None:
        atomic_write_text(directory / QUANTIZATION_FILE, json.dumps(quantization, indent=2) + "\n")
    else:
        (directory / QUANTIZATION_FILE).unlink(missing_ok=True)
    atomic_write_text(directory / CONFIG_FILE, json.dumps(config.to_dict(), indent=2) + "\n")
    return directory


def load_config(directory: str | Path) -> ModelConfig:
    """The config in a run folder; a missing folder or one without config.json is a QkvError."""
    directory = Path(directory)
    if not directory.exists():
        raise QkvError(f"{directory} does not exist: check the path, or train a model first with `qkv train`")
    if not directory.is_dir():
        raise QkvError(f"{directory} is a file, not a run directory: give the folder `qkv train` wrote")
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise QkvError(f"{directory} is not a qkv run directory (no {CONFIG_FILE}): give the folder `qkv train` wrote")
    data: Any = read_json(path, what="model config")
    if not isinstance(data, dict):
        raise QkvError(f"{CONFIG_FILE} in {directory} is not a JSON object: restore it from the run that wrote it")
    try:
        return ModelConfig.from_dict(data)
    except QkvError as error:
        raise QkvError(f"{CONFIG_FILE} in {directory}: {error}") from None
    except (TypeError, ValueError) as error:
        raise QkvError(f"{CONFIG_FILE} in {directory} is damaged ({error}): restore it from the run") from None


def load_model_dir(
    directory: str | Path,
    *,
    device: str | torch.device = "cpu",
    weights_name: str = MODEL_FILE,
    weights_path: str | Path | None = None,
) -> ModelBundle:
    """Load a folder written by :func:`save_model_dir`: the model in eval mode on ``device``, and its tokenizers.

    The weights come from ``directory / weights_name``, or from ``weights_path`` if given (for example the
    model.safetensors of a training checkpoint). With a quantization.json the model gets its quantized layers first.
    """
    directory = Path(directory)
    config = load_config(directory)
    if not (directory / TOKENIZER_FILE).is_file():
        raise QkvError(f"{directory} has no {TOKENIZER_FILE}: copy the tokenizer the model was trained with into it")
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    target_path = directory / TARGET_TOKENIZER_FILE
    target = load_tokenizer(target_path) if target_path.is_file() else None
    if target is not None and not family_of(config).two_vocabularies:
        raise QkvError(
            f"{directory} has a {TARGET_TOKENIZER_FILE} but holds {family_of(config).title}, which has one "
            "vocabulary: remove that file"
        )
    check_vocab(config, tokenizer, target, directory)
    check_fits(config, device)  # a config.json asking for more memory than there is: the figure, not a crash
    model = build_model(config)
    if (directory / QUANTIZATION_FILE).is_file():
        info = read_json(directory / QUANTIZATION_FILE, what="quantization description")
        apply_quantization(model, info, where=f"{QUANTIZATION_FILE} in {directory}")
    weights = Path(weights_path) if weights_path is not None else directory / weights_name
    load_weights(model, weights, device=device)
    _check_numbers(model, weights, quantized=(directory / QUANTIZATION_FILE).is_file())
    model.eval()
    return ModelBundle(
        model=model,
        config=config,
        tokenizer=tokenizer,
        target_tokenizer=target,
        path=directory,
        chat_template=read_chat_template(directory),
    )


def _check_numbers(model: nn.Module, weights: Path, *, quantized: bool) -> None:
    """A QkvError naming the first weight (or int8 scale) that holds NaN or an infinity."""
    found = storage.non_finite(storage.model_tensors(model))
    if found is None:
        return
    name, what = found
    if quantized:
        raise QkvError(f"the weights in {weights} hold {what} (tensor {name}): quantize the original run again")
    raise QkvError(
        f"the weights in {weights} hold {what} (tensor {name}; the training diverged before they were saved): use "
        "an earlier checkpoint, or train again with a lower --lr"
    )


def read_chat_template(directory: Path) -> str | None:
    """The text of ``directory``'s chat_template.jinja, None without one; an unreadable or empty one is a QkvError."""
    path = directory / CHAT_TEMPLATE_FILE
    return read_text(path, what="chat template") if path.is_file() else None
