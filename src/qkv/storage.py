"""Named tensors in and out of a safetensors file: the storage format below every saved model and checkpoint.

Safetensors is a flat table of named tensors plus a JSON header; loading it runs no code (unlike pickle,
which is never used here). A tensor shared by two modules is stored once: with tied embeddings
(W_U = W_E^T) the file holds ``embedding.token_embedding.weight`` and not ``unembedding.weight``; the
header's ``"tied"`` entry records which names were left out and which stored name they share. Loading
copies each stored tensor into the model's own parameters, so the model keeps its ties. The header also
says which kind of model wrote the file (``"model": "gpt"``) and, for quantized weights, their scheme
(``"quantization": "int8"`` or ``"int4"``), so that weights are never copied into a model of another kind.

This module knows files and tensors, not models: the folder around the file (config.json, the tokenizers)
is :mod:`qkv.model_dir`, and which layers are quantized is :mod:`qkv.quantization`. Every write is atomic (a
temporary file, then a rename), and every problem with a file is a :class:`~qkv.errors.QkvError` naming
the file and the fix.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.io import atomic_write, check_readable
from qkv.sharded import local_part, placed_like

MODEL_FILE = "model.safetensors"  # the weights of a model folder and of each training checkpoint
QUANTIZATION_FILE = "quantization.json"  # named in the messages; written by qkv.model_dir


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
    """The kind a qkv model's config names ("gpt", ...: every config class has one, ``ModelConfig.kind``); any other
    module's (an adapter's) class name. This module sits below :mod:`qkv.models`, which saves through it."""
    kind = getattr(getattr(model, "config", None), "kind", None)
    return kind if isinstance(kind, str) else type(model).__name__


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


def save_weights(
    model: nn.Module,
    path: str | Path,
    *,
    state: dict[str, Tensor] | None = None,
    quantization: str | None = None,
) -> None:
    """Write the model's state_dict to ``path`` (safetensors), each shared tensor once, atomically.

    ``state`` replaces ``model.state_dict()``, e.g. the whole tensors gathered from a sharded (FSDP) model.
    ``quantization`` is the scheme of the model's quantized layers ("int8", "int4"), recorded in the header; None for a
    float model. (:func:`qkv.model_dir.save_weights` fills it in from the model.)
    """
    model = unwrap_model(model)
    state = model.state_dict() if state is None else state
    tensors: dict[str, Tensor] = {}
    tied: dict[str, str] = {}
    for group in shared_groups(state):
        tensors[group[0]] = state[group[0]]
        tied.update({alias: group[0] for alias in group[1:]})
    metadata = {"format": "qkv", "model": _model_kind(model), "tied": json.dumps(tied)}
    if quantization is not None:
        metadata["quantization"] = quantization
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
    check_readable(path, "the weights")
    if not path.is_file():
        raise QkvError(f"{_where(path)} does not exist: give the folder the model was saved to, or save it again")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
            return {name: f.get_tensor(name) for name in f.keys()}, metadata
    except Exception as error:  # SafetensorError, OSError, ... : all mean the bytes are not a whole file
        raise damaged_error(path, error, fix) from None


def non_finite(named: Iterable[tuple[str, Tensor]]) -> tuple[str, str] | None:
    """The first floating tensor of ``named`` (name, tensor) that holds NaN or an infinity: (its name, "NaN" or
    "infinite values"); None when every value is a number. A weight that is not a number makes every output NaN
    (greedy decoding then prints nothing), so each model is checked as it loads, whatever its format."""
    for name, tensor in named:
        if tensor.is_floating_point() and not all(bool(torch.isfinite(part).all()) for part in _parts(tensor)):
            return name, "NaN" if bool(torch.isnan(tensor).any()) else "infinite values"
    return None


CHECK_NUMBERS = 1 << 22  # numbers checked at a time: isfinite's temporaries (|x| and two masks) stay near 30 MB


def _parts(tensor: Tensor) -> Iterable[Tensor]:
    """``tensor`` in pieces of about :data:`CHECK_NUMBERS` numbers (views, no copy), so that checking a large
    matrix never holds temporaries of its own size (a GGUF's embedding: 113 MB of float32)."""
    if tensor.dim() == 0 or tensor.numel() <= CHECK_NUMBERS:
        return [tensor]
    if tensor.is_contiguous():
        return tensor.view(-1).split(CHECK_NUMBERS)
    return tensor.split(max(1, CHECK_NUMBERS // max(1, tensor[0].numel())))


def model_tensors(model: nn.Module) -> Iterable[tuple[str, Tensor]]:
    """Every weight of ``model`` (parameters and saved buffers, such as an int8 layer's scales), each once."""
    seen: set[int] = set()
    for name, tensor in unwrap_model(model).state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield name, tensor.detach()


def check_finite(named: Iterable[tuple[str, Tensor]], where: str, fix: str) -> None:
    """QkvError naming the first tensor of ``named`` that holds NaN or an infinity: "tensor NAME in WHERE holds NaN:
    FIX"."""
    found = non_finite(named)
    if found is not None:
        raise QkvError(f"tensor {found[0]} in {where} holds {found[1]}: {fix}")


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_header(path: Path, metadata: dict[str, str], model: nn.Module, quantization: str | None) -> None:
    """QkvError unless the file's header fits ``model``: written for its kind of model, and quantized by the
    scheme ``quantization`` names (None: a float model, whose file has no scheme)."""
    kind = metadata.get("model")
    if metadata.get("format") == "qkv" and kind != _model_kind(model):
        raise QkvError(
            f"{_where(path)} holds the weights of a {kind} model, not of the {_model_kind(model)} model the "
            "config describes: the files come from different runs; save the model again"
        )
    scheme = metadata.get("quantization")
    if scheme and quantization is None:
        raise QkvError(
            f"{_where(path)} holds {scheme} weights written by `qkv quantize`, but no {QUANTIZATION_FILE} says "
            "which layers: copy that file back beside it, or use the original run"
        )
    if quantization is not None and metadata.get("format") == "qkv" and not scheme:
        raise QkvError(
            f"{_where(path)} holds float weights, but {QUANTIZATION_FILE} describes an {quantization} model: remove "
            f"{QUANTIZATION_FILE}, or quantize the run again with `qkv quantize`"
        )
    if scheme and quantization is not None and scheme != quantization:
        raise QkvError(
            f"{_where(path)} holds {scheme} weights, but {QUANTIZATION_FILE} describes an {quantization} model: the "
            "files come from different `qkv quantize` runs; quantize the original run again"
        )


def _tied_aliases(path: Path, metadata: dict[str, str], fix: str | None) -> dict[str, str]:
    """The header's ``"tied"`` entry: each name left out of the file -> the stored name it shares."""
    try:
        return json.loads(metadata.get("tied", "{}"))
    except json.JSONDecodeError as error:
        raise damaged_error(path, error, fix) from None


def _group_tensor(path: Path, group: list[str], stored: dict[str, Tensor], aliases: dict[str, str]) -> str | None:
    """The stored name that holds the tensor of ``group`` (names the model ties): one of them, or the name the
    header's aliases give for one; None when the file has none. Two stored copies that differ are a QkvError."""
    present = [name for name in group if name in stored]
    source = present[0] if present else next((aliases[n] for n in group if aliases.get(n) in stored), None)
    for other in present[1:]:
        assert source is not None  # present is not empty
        if not torch.equal(stored[other], stored[source]):
            raise QkvError(
                f"{_where(path)} stores different tensors for {source} and {other}, but the model ties them: "
                "set tie_embeddings (or share_embeddings) to false in config.json"
            )
    return source


def _matched_tensors(
    path: Path, stored: dict[str, Tensor], state: dict[str, Tensor], aliases: dict[str, str]
) -> dict[str, Tensor]:
    """The file's tensor for each name of the model's ``state``, shapes checked; a QkvError names the tensors
    the file has and the model lacks, or those the model needs and the file lacks."""
    unexpected = sorted(set(stored) - set(state))
    if unexpected:
        raise QkvError(
            f"{_where(path)} has tensors the model does not have ({_names(unexpected)}): "
            "the weights belong to a different model or config; check config.json"
        )
    loaded: dict[str, Tensor] = {}
    missing: list[str] = []
    for group in shared_groups(state):
        source = _group_tensor(path, group, stored, aliases)
        if source is None:
            missing.extend(group)
            continue
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
    return loaded


def load_weights(
    model: nn.Module,
    path: str | Path,
    *,
    device: str | torch.device | None = None,
    fix: str | None = None,
    quantization: str | None = None,
) -> nn.Module:
    """Copy the weights in ``path`` into ``model`` (moved to ``device`` first if given) and return it.

    Every tensor the model has must be in the file with the same shape, and the file must hold nothing
    else; otherwise a QkvError names the tensors. ``fix`` overrides the advice given for a damaged file.
    ``quantization`` is the scheme of the model's quantized layers (None for a float model): the file's header
    must say the same. (:func:`qkv.model_dir.load_weights` fills it in from the model.)
    """
    path = Path(path)
    model = unwrap_model(model)
    if device is not None:
        model.to(device)
    stored, metadata = read_tensors(path, fix=fix)
    _check_header(path, metadata, model, quantization)
    aliases = _tied_aliases(path, metadata, fix)
    state = model.state_dict()
    loaded = _matched_tensors(path, stored, state, aliases)
    with torch.no_grad():
        # A sharded (FSDP) model takes this process's rows of each whole tensor.
        model.load_state_dict({name: placed_like(loaded[name], state[name]) for name in loaded}, strict=True)
    return model
