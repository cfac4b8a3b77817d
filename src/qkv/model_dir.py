"""The saved form of a model: a folder with ``config.json``, ``tokenizer.json`` and ``model.safetensors``.

This is the Hugging Face layout, and every part of qkv that reads or writes a model goes through it
(training, generation, the pretrained importers, the server)::

    runs/shakespeare/
      config.json             model.config.to_dict(): {"model": "gpt", "d_model": 128, ...}
      tokenizer.json          Tokenizer.save(): the vocabulary (the rows of W_E, in order)
      tokenizer_target.json   encoder-decoder models with a separate target vocabulary only
      model.safetensors       every weight, by its state_dict name ("decoder.blocks.0.self_attn.query.weight")
      quantization.json       int8 models only (:mod:`qkv.quantization`): which layers hold int8 weights

Safetensors is a flat table of named tensors plus a JSON header; loading it runs no code (unlike pickle,
which is never used here). A tensor shared by two modules is stored once: with tied embeddings
(W_U = W_E^T) the file holds ``embedding.token_embedding.weight`` and not ``unembedding.weight``; the
header's ``"tied"`` entry records which names were left out and which stored name they share. Loading
copies each stored tensor into the model's own parameters, so the model keeps its ties.

A quantized model (``qkv quantize``) is the same folder: its int8 layers store ``qweight`` (int8) and
``weight_scale`` instead of ``weight``, the header says ``"quantization": "int8"``, and ``quantization.json``
names the int8 layers, so that loading builds them before copying the weights in (no original needed).

Every write is atomic (a temporary file, then a rename), so an interrupted save never leaves a half-written
file behind, and every problem with the files is a :class:`~qkv.errors.QkvError` naming the file and the fix.
"""

from __future__ import annotations

import errno
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.io import atomic_write, atomic_write_text, read_json
from qkv.models.config import TRANSLATORS, ModelConfig
from qkv.models.family import build_model
from qkv.quantization import apply_quantization, is_quantized, quantization_info
from qkv.sharded import local_part, placed_like
from qkv.tokenizers import Tokenizer, load_tokenizer

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"
TARGET_TOKENIZER_FILE = "tokenizer_target.json"
QUANTIZATION_FILE = "quantization.json"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside DistributedDataParallel (``.module``) or torch.compile (``._orig_mod``)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model


def _model_kind(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "kind", type(model).__name__)


def shared_groups(state: dict[str, Tensor]) -> list[list[str]]:
    """State-dict names grouped by the tensor they are (tied weights give groups of 2 or more), in order."""
    groups: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        tensor = local_part(tensor)  # a shard (FSDP): tied names share its local tensor
        if tensor.device.type == "meta":
            key: tuple = ("meta", name)
        else:
            storage = tensor.untyped_storage().data_ptr()
            key = (tensor.device, storage, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()))
        groups.setdefault(key, []).append(name)
    return list(groups.values())


def save_tensors(path: str | Path, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write tensors to a safetensors file atomically; tensors that overlap in memory are copied apart."""
    seen: set[tuple] = set()
    ready: dict[str, Tensor] = {}
    for name, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        storage = (tensor.untyped_storage().data_ptr(), tensor.untyped_storage().nbytes())
        ready[name] = tensor.clone() if storage in seen and tensor.numel() else tensor
        seen.add(storage)

    def write(tmp: str) -> None:
        try:
            save_file(ready, tmp, metadata=metadata)
        except SafetensorError as error:  # a full or read-only disk: an OSError naming the file, like any write
            raise OSError(errno.EIO, str(error), str(path)) from None

    atomic_write(path, write)


def save_weights(model: nn.Module, path: str | Path, *, state: dict[str, Tensor] | None = None) -> None:
    """Write the model's state_dict to ``path`` (safetensors), each shared tensor once, atomically.

    ``state`` replaces ``model.state_dict()``, e.g. the whole tensors gathered from a sharded (FSDP) model.
    """
    model = unwrap_model(model)
    state = model.state_dict() if state is None else state
    tensors: dict[str, Tensor] = {}
    tied: dict[str, str] = {}
    for group in shared_groups(state):
        tensors[group[0]] = state[group[0]]
        tied.update({alias: group[0] for alias in group[1:]})
    metadata = {"format": "qkv", "model": _model_kind(model), "tied": json.dumps(tied)}
    if is_quantized(model):
        metadata["quantization"] = "int8"
    save_tensors(path, tensors, metadata)


def _where(path: Path) -> str:
    return f"{path.name} in {path.parent}"


def damaged_error(path: Path, error: BaseException, fix: str | None = None) -> QkvError:
    detail = str(error).splitlines()[0] if str(error) else type(error).__name__
    if fix is None and path.parent.parent.name == "checkpoints":  # a file inside a training checkpoint
        fix = f"delete {path.parent} to use the checkpoint before it"
    elif fix is None:
        fix = f"restore it, or resume from the checkpoint in {path.parent / 'checkpoints'}"
    return QkvError(f"{_where(path)} is damaged or truncated ({detail}): {fix}")


def read_tensors(
    path: str | Path, *, device: str | torch.device = "cpu", fix: str | None = None
) -> tuple[dict[str, Tensor], dict[str, str]]:
    """All tensors and the header metadata of a safetensors file; a missing or damaged file is a QkvError."""
    path = Path(path)
    if not path.is_file():
        raise QkvError(f"{_where(path)} does not exist: give the folder the model was saved to, or save it again")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
            return {name: f.get_tensor(name) for name in f.keys()}, metadata
    except Exception as error:  # SafetensorError, OSError, ... : all mean the bytes are not a whole file
        raise damaged_error(path, error, fix) from None


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def load_weights(
    model: nn.Module, path: str | Path, *, device: str | torch.device | None = None, fix: str | None = None
) -> nn.Module:
    """Copy the weights in ``path`` into ``model`` (moved to ``device`` first if given) and return it.

    Every tensor the model has must be in the file with the same shape, and the file must hold nothing
    else; otherwise a QkvError names the tensors. ``fix`` overrides the advice given for a damaged file.
    """
    path = Path(path)
    model = unwrap_model(model)
    if device is not None:
        model.to(device)
    stored, metadata = read_tensors(path, fix=fix)
    kind = metadata.get("model")
    if metadata.get("format") == "qkv" and kind != _model_kind(model):
        raise QkvError(
            f"{_where(path)} holds the weights of a {kind} model, not of the {_model_kind(model)} model the "
            "config describes: the files come from different runs; save the model again"
        )
    scheme = metadata.get("quantization")
    if scheme and not is_quantized(model):
        raise QkvError(
            f"{_where(path)} holds {scheme} weights written by `qkv quantize`, but no {QUANTIZATION_FILE} says "
            "which layers: copy that file back beside it, or use the original run"
        )
    if is_quantized(model) and metadata.get("format") == "qkv" and not scheme:
        raise QkvError(
            f"{_where(path)} holds float weights, but {QUANTIZATION_FILE} describes an int8 model: remove "
            f"{QUANTIZATION_FILE}, or quantize the run again with `qkv quantize`"
        )
    try:
        aliases = json.loads(metadata.get("tied", "{}"))
    except json.JSONDecodeError as error:
        raise damaged_error(path, error, fix) from None
    state = model.state_dict()
    expected = set(state)
    unexpected = sorted(set(stored) - expected)
    if unexpected:
        raise QkvError(
            f"{_where(path)} has tensors the model does not have ({_names(unexpected)}): "
            "the weights belong to a different model or config; check config.json"
        )
    loaded: dict[str, Tensor] = {}
    missing: list[str] = []
    for group in shared_groups(state):
        present = [name for name in group if name in stored]
        source = present[0] if present else next((aliases[n] for n in group if aliases.get(n) in stored), None)
        if source is None:
            missing.extend(group)
            continue
        for other in present[1:]:
            if not torch.equal(stored[other], stored[source]):
                raise QkvError(
                    f"{_where(path)} stores different tensors for {source} and {other}, but the model ties them: "
                    "set tie_embeddings (or share_embeddings) to false in config.json"
                )
        for name in group:
            want, got = tuple(state[name].shape), tuple(stored[source].shape)
            if want != got:
                raise QkvError(
                    f"tensor {name} in {_where(path)} has shape {list(got)} but the model expects {list(want)}: "
                    "the weights were saved with a different config; use that run's config.json"
                )
            loaded[name] = stored[source]
    if missing:
        raise QkvError(
            f"{_where(path)} lacks {len(missing)} tensor(s) the model needs ({_names(missing)}): "
            "the weights belong to a different model or config; check config.json"
        )
    with torch.no_grad():
        # A sharded (FSDP) model takes this process's rows of each whole tensor.
        model.load_state_dict({name: placed_like(loaded[name], state[name]) for name in loaded}, strict=True)
    return model


@dataclass
class ModelBundle:
    """Everything loaded from a model folder: the model (eval mode), its config, its tokenizer(s)."""

    model: nn.Module
    config: ModelConfig
    tokenizer: Tokenizer
    target_tokenizer: Tokenizer | None
    path: Path


def _vocab_checks(config: ModelConfig, has_target: bool) -> list[tuple[str, str]]:
    """(tokenizer file, config field) pairs whose sizes must agree."""
    if config.kind in TRANSLATORS:
        if has_target:
            return [(TOKENIZER_FILE, "src_vocab_size"), (TARGET_TOKENIZER_FILE, "tgt_vocab_size")]
        return [(TOKENIZER_FILE, "src_vocab_size"), (TOKENIZER_FILE, "tgt_vocab_size")]
    return [(TOKENIZER_FILE, "vocab_size")]


def check_vocab(
    config: ModelConfig, tokenizer: Tokenizer, target_tokenizer: Tokenizer | None, directory: str | Path
) -> None:
    """Raise QkvError unless the tokenizer(s) have as many tokens as the config's embedding has rows."""
    if target_tokenizer is not None and config.kind not in TRANSLATORS:
        raise QkvError(f"a {config.kind} model has one vocabulary: drop the target tokenizer")
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
) -> Path:
    """Write config.json, tokenizer.json (+ tokenizer_target.json), the weights (+ quantization.json for an
    int8 model) into ``directory``.

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
    directory.mkdir(parents=True, exist_ok=True)
    if weights_name is not None:
        save_weights(model, directory / weights_name, state=state)
    tokenizer.save(directory / TOKENIZER_FILE)
    if target_tokenizer is not None:
        target_tokenizer.save(directory / TARGET_TOKENIZER_FILE)
    else:
        (directory / TARGET_TOKENIZER_FILE).unlink(missing_ok=True)  # a stale one would pair with this model
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
    model.safetensors of a training checkpoint). With a quantization.json the model gets its int8 layers first.
    """
    directory = Path(directory)
    config = load_config(directory)
    if not (directory / TOKENIZER_FILE).is_file():
        raise QkvError(f"{directory} has no {TOKENIZER_FILE}: copy the tokenizer the model was trained with into it")
    tokenizer = load_tokenizer(directory / TOKENIZER_FILE)
    target_path = directory / TARGET_TOKENIZER_FILE
    target = load_tokenizer(target_path) if target_path.is_file() else None
    if target is not None and config.kind not in TRANSLATORS:
        raise QkvError(f"{directory} has a {TARGET_TOKENIZER_FILE} but holds a {config.kind} model: remove that file")
    check_vocab(config, tokenizer, target, directory)
    from qkv.models.memory import check_fits

    check_fits(config, device)  # a config.json asking for more memory than there is: the figure, not a crash
    model = build_model(config)
    if (directory / QUANTIZATION_FILE).is_file():
        info = read_json(directory / QUANTIZATION_FILE, what="quantization description")
        apply_quantization(model, info, where=f"{QUANTIZATION_FILE} in {directory}")
    weights = Path(weights_path) if weights_path is not None else directory / weights_name
    load_weights(model, weights, device=device)
    if any(p.is_floating_point() and not torch.isfinite(p).all() for p in model.parameters()):
        raise QkvError(
            f"the weights in {weights} hold NaN or infinite values (the training diverged before they were "
            "saved): use an earlier checkpoint, or train again with a lower --lr"
        )
    model.eval()
    return ModelBundle(model=model, config=config, tokenizer=tokenizer, target_tokenizer=target, path=directory)
