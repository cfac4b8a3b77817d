"""A LoRA adapter on disk, in PEFT's layout, so that ``peft.PeftModel.from_pretrained`` loads what qkv trained::

    runs/smol-lora/
      adapter_config.json           PEFT's LoraConfig: r, lora_alpha, lora_dropout, target_modules, the base's path
      adapter_model.safetensors     A and B of every adapted projection, by PEFT's names
                                    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", (r, d_in))
      config.json, tokenizer.json, chat_template.jinja    the base's (the run folder's own files)

Opening such a folder (:func:`qkv.load`) opens the base the config names (``base_model_name_or_path``: a qkv run,
a Hugging Face folder or a GGUF file), wraps its projections in LoRA layers and loads the adapters: the model
the adapters were trained on. A run trained over an int8 base (``qkv train --quantize-base int8``, its
train_config.json says so) reopens over the int8 base.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from qkv.errors import QkvError
from qkv.io import atomic_write_json, read_json
from qkv.models.family import family_of
from qkv.models.lora import (
    AdapterWeights,
    LoRASettings,
    adapted_targets,
    apply_lora,
    load_peft_state,
    lora_layers,
    peft_state,
)
from qkv.run_dir import TRAIN_CONFIG_FILE
from qkv.storage import load_weights, read_tensors, save_tensors

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class AdapterConfig:
    """What adapter_config.json says that qkv uses: the base model's path and the LoRA settings."""

    base: str
    settings: LoRASettings
    base_quantization: str | None = None  # "int8": the base the adapters were trained over (train_config.json)
    base_group_size: int | None = None  # its int8 scales' group (0: per row; None: not recorded, the default)


def is_adapter_dir(directory: str | Path) -> bool:
    return (Path(directory) / ADAPTER_CONFIG_FILE).is_file()


def save_adapter_config(directory: str | Path, model: nn.Module, settings: LoRASettings, *, base: str) -> None:
    """Write adapter_config.json for ``model``'s adapters (PEFT's LoraConfig fields; PEFT fills the rest)."""
    family = family_of(model)
    targets = adapted_targets(model)
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": list(targets),
        "bias": "none",
        "fan_in_fan_out": any(family.lora_targets[name].transposed for name in targets),
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
    }
    atomic_write_json(Path(directory) / ADAPTER_CONFIG_FILE, config)


def save_adapter_weights(path: str | Path, model: nn.Module) -> None:
    """Write ``model``'s adapters to ``path`` (adapter_model.safetensors), under PEFT's key names."""
    if not lora_layers(model):
        raise QkvError("the model has no LoRA adapters to save")
    save_tensors(path, peft_state(model), {"format": "pt"})


def read_adapter_config(directory: str | Path) -> AdapterConfig:
    """adapter_config.json of ``directory``, checked: a LoRA adapter qkv can apply (one rank for every target)."""
    directory = Path(directory)
    path = directory / ADAPTER_CONFIG_FILE
    data = read_json(path, what="adapter config")
    if not isinstance(data, dict):
        raise QkvError(f"{path} is not a JSON object: save the adapter again")
    if data.get("peft_type", "LORA") != "LORA":
        raise QkvError(f"{path} is a {data.get('peft_type')} adapter, not LoRA: qkv applies LoRA adapters")
    for key in ("rank_pattern", "alpha_pattern"):
        if data.get(key):
            raise QkvError(f"{path} gives some targets their own rank or alpha ({key}): qkv applies one rank to all")
    if data.get("use_dora") or data.get("use_rslora"):
        raise QkvError(f"{path} is a DoRA or rsLoRA adapter: qkv applies plain LoRA")
    base = data.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise QkvError(f"{path} names no base model (base_model_name_or_path): add the path of the model it adapts")
    targets = data.get("target_modules") or []
    rank: Any = data.get("r")  # JSON's value, whatever it is: LoRASettings checks it
    try:
        settings = LoRASettings(
            rank=rank,
            alpha=float(data.get("lora_alpha", 8)),
            dropout=float(data.get("lora_dropout", 0.0)),
            targets=tuple([targets] if isinstance(targets, str) else targets),
        )
    except (TypeError, ValueError) as error:
        raise QkvError(f"{path} is damaged ({error}): save the adapter again") from None
    return AdapterConfig(base, settings, *_base_quantization(directory))


def _base_quantization(directory: Path) -> tuple[str | None, int | None]:
    """The quantization of the base a qkv run trained its adapters over and its group size, as its
    train_config.json records them (None: a float base, or a run from before qkv recorded the group)."""
    path = directory / TRAIN_CONFIG_FILE
    if not path.is_file():
        return None, None
    train = read_json(path, what="training settings").get("train", {})
    if not isinstance(train, dict):
        return None, None
    group = train.get("base_group_size")
    return train.get("quantize_base"), group if isinstance(group, int) and not isinstance(group, bool) else None


def load_adapter(model: nn.Module, directory: str | Path, *, checkpoint: str | Path | None = None) -> nn.Module:
    """Wrap ``model``'s projections in LoRA layers as ``directory``'s adapter_config.json says and load the
    adapters: the folder's adapter_model.safetensors, or a training checkpoint's weights (``checkpoint``, the
    model.safetensors of a LoRA run's checkpoint, which holds the adapters alone); returns the model (eval mode)."""
    directory = Path(directory)
    config = read_adapter_config(directory)
    apply_lora(model, config.settings)
    if checkpoint is not None:
        load_weights(AdapterWeights(model), checkpoint)
    else:
        path = directory / ADAPTER_FILE
        tensors, _ = read_tensors(path)
        load_peft_state(model, tensors, where=str(path))
    return model.eval()
