"""Loading a Hugging Face model folder: config.json picks the family, whose table converts the weights.

A Hugging Face folder holds ``config.json`` (the architecture: ``model_type`` plus its sizes) and the
weights: ``model.safetensors``, a sharded ``model.safetensors.index.json`` with its shards, or the older
``pytorch_model.bin``, which is read with ``torch.load(weights_only=True)`` so that no pickled code can run.

``model_type`` names the family (:data:`ARCHITECTURES`, gathered from the families' descriptions); the
family's Hugging Face module (``qkv/models/<family>/huggingface.py``) maps config.json to a qkv config, the
weights to a qkv model through one table of names (:mod:`qkv.models.hf_tables`), and loads the tokenizer(s).
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from qkv.chat_templates.source import hf_folder_template
from qkv.errors import QkvError
from qkv.io import check_readable
from qkv.model_dir import ModelBundle, save_model_dir
from qkv.models.config import ModelConfig
from qkv.models.description import HFConversion
from qkv.models.family import families, family_of
from qkv.models.memory import check_fits
from qkv.pretrained.hub import resolve_model_dir
from qkv.storage import check_finite, read_tensors

ARCHITECTURES: dict[str, HFConversion] = {
    model_type: family.hf_conversion
    for family in families().values()
    if family.hf_conversion is not None
    for model_type in family.hf_model_types
}
"""config.json's ``model_type`` -> the family's module that converts it (gpt2, bert, marian; llama, qwen2 and
mistral share one table)."""


# ------------------------------------------------------------------------------------------ reading


def read_hf_config(folder: Path) -> dict[str, Any]:
    """config.json of a Hugging Face folder as a dict; a missing or broken file is a QkvError."""
    path = folder / "config.json"
    check_readable(path, "the model config")
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
    check_readable(path, "the weights")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)  # tensors only: never runs pickled code
    except Exception as error:  # noqa: BLE001 - torch's own message advises weights_only=False: never say that
        why = "it holds Python objects besides tensors, which qkv never unpickles"
        if not isinstance(error, pickle.UnpicklingError):
            why = f"the file is damaged or not a PyTorch file ({type(error).__name__})"
        raise QkvError(
            f"{path.name} in {path.parent} cannot be read as plain tensors ({why}): use the model's "
            "model.safetensors, or convert the weights with the library that wrote them"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
        raise QkvError(f"{path.name} in {path.parent} is not a state dict of tensors: use the model's safetensors")
    return state


def _read_shards(index: Path, read: Callable[[Path], dict[str, Tensor]]) -> dict[str, Tensor]:
    """The tensors of every shard an index's ``weight_map`` (tensor name -> shard file) names, each shard a file
    of the model's folder: a name that leaves the folder (``../x``, ``/etc/x``) or a map of another shape is refused."""
    check_readable(index, "the index")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise QkvError(f"{index.name} in {index.parent} is damaged ({error}): download the model again") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in weight_map.items())
    ):
        raise QkvError(
            f"{index.name} in {index.parent} is damaged: its weight_map must map each tensor name to a shard file "
            "name; download the model again"
        )
    folder = index.parent.resolve()
    state: dict[str, Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        path = (folder / shard).resolve()
        if path.parent != folder:
            raise QkvError(
                f"{index.name} in {index.parent} names the shard {shard!r}, outside the model's folder: a model's "
                "shards lie beside its index; download the model again"
            )
        if not path.is_file():
            raise QkvError(f"{index.parent} lacks the shard {shard} listed in {index.name}: download it too")
        state.update(read(path))
    return state


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    return read_tensors(path, fix="download the model again")[0]


def read_hf_weights(folder: Path) -> dict[str, Tensor]:
    """All tensors of a Hugging Face folder, by their Hugging Face names (safetensors preferred)."""
    return hf_weights_reader(folder)()


def hf_weights_reader(folder: Path) -> Callable[[], dict[str, Tensor]]:
    """How the folder's weights are read (safetensors preferred), found without reading them: a folder without
    weights is refused before anything else is read."""
    if (folder / "model.safetensors").is_file():
        return lambda: _read_safetensors(folder / "model.safetensors")
    if (folder / "model.safetensors.index.json").is_file():
        return lambda: _read_shards(folder / "model.safetensors.index.json", _read_safetensors)
    if (folder / "pytorch_model.bin").is_file():
        return lambda: _read_bin(folder / "pytorch_model.bin")
    if (folder / "pytorch_model.bin.index.json").is_file():
        return lambda: _read_shards(folder / "pytorch_model.bin.index.json", _read_bin)
    raise QkvError(
        f"{folder} has no weights (model.safetensors, model.safetensors.index.json or pytorch_model.bin): "
        "download them into the folder"
    )


# ------------------------------------------------------------------------------------------ public API


def readable_architectures() -> list[str]:
    """The Hugging Face ``architectures`` qkv imports, from the model families (:func:`qkv.models.family.families`)."""
    return [name for family in families().values() for name in family.hf_architectures]


def architecture(hf_config: dict[str, Any], folder: Path | str = "the model folder") -> HFConversion:
    """The family's converter for config.json's ``model_type``; unknown types are a QkvError."""
    model_type = hf_config.get("model_type")
    if model_type not in ARCHITECTURES:
        named = hf_config.get("architectures")
        shown = repr(model_type) + (f" ({', '.join(map(str, named))})" if isinstance(named, list) and named else "")
        raise QkvError(
            f"{folder} holds a {shown} model (config.json's model_type), which qkv cannot import: qkv reads "
            f"{', '.join(readable_architectures())}"
        )
    return ARCHITECTURES[model_type]


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
    config = _config(module, hf_config, folder)
    check_fits(config, device)  # num_hidden_layers 10^8: the figure, before anything is read or built
    read_weights = hf_weights_reader(folder)
    tokenizer, target_tokenizer = module.load_tokenizers(folder, hf_config)
    _check_vocabularies(config, (tokenizer, target_tokenizer), folder)
    weights = read_weights()
    check_finite(weights.items(), f"the weights of {folder}", "the file is damaged; download the model again")
    model = module.convert(weights, hf_config)
    model.to(device)
    model.eval()
    return ModelBundle(
        model=model,
        config=cast(ModelConfig, model.config),  # the family's config, which nn.Module's stubs cannot name
        tokenizer=tokenizer,
        target_tokenizer=target_tokenizer,
        path=folder,
        chat_template=hf_folder_template(folder),
    )


def _config(module: HFConversion, hf_config: dict[str, Any], folder: Path) -> Any:
    """The family's qkv config for config.json, every problem one line naming the folder."""
    try:
        return module.config_from_hf(hf_config)
    except QkvError as error:
        raise QkvError(f"{folder}: {error}") from None
    except (TypeError, ValueError, ArithmeticError, AttributeError) as error:  # a value of a shape no row expects
        raise QkvError(
            f"config.json in {folder} holds a value qkv cannot use ({type(error).__name__}: {error}): download the "
            "model's config.json again"
        ) from None


def _check_vocabularies(config: Any, tokenizers: tuple[Any, Any], folder: Path) -> None:
    """Each tokenizer fits the rows of its embedding: a token id past the last row has no vector (an IndexError
    deep in the model). A tokenizer with fewer tokens than rows is common (rows padded to a round number)."""
    fields = family_of(config).vocab_fields
    for tokenizer, field in zip(tokenizers, fields, strict=False):
        tokenizer = tokenizer or tokenizers[0]
        rows = getattr(config, field)
        if tokenizer.vocab_size > rows:
            raise QkvError(
                f"{folder}: the tokenizer has {tokenizer.vocab_size} tokens but config.json gives the embedding "
                f"{rows} rows (vocab_size), so the ids from {rows} on have no vector: put the model's own tokenizer "
                "files beside it, or fix vocab_size"
            )


def save_as_qkv(bundle: ModelBundle, out_dir: str | Path) -> Path:
    """Write a loaded model in qkv's own folder format (reload it with :func:`qkv.model_dir.load_model_dir`)."""
    return save_model_dir(
        out_dir, bundle.model, bundle.tokenizer, bundle.target_tokenizer, chat_template=bundle.chat_template
    )
