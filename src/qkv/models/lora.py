"""LoRA on a whole model: which projections get an adapter, the adapters under PEFT's names, and merging.

The family says which projections exist and what PEFT calls them (:attr:`~qkv.models.description.Family.lora_targets`:
``q_proj`` ... ``down_proj`` for Llama, ``c_attn`` ... for GPT-2), so targets are named as a PEFT user names them::

    settings = LoRASettings(rank=8, alpha=16, targets=("q_proj", "v_proj"))     # or ("all",)
    apply_lora(model, settings)          # every parameter frozen; the targets wrapped in LoRALinear, in place
    peft_state(model)                    # {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": A, ...}
    load_peft_state(model, tensors)      # the inverse (a saved adapter back into the wrapped model)
    merge_lora(model)                    # every LoRALinear replaced by its merged Linear (W + (alpha / r) B A)

PEFT's key for a target is ``base_model.model.<module>.lora_A.weight`` (A, (r, d_in)) and ``...lora_B.weight`` (B,
(d_out, r)), the module named as in the Hugging Face model. A target over several qkv projections (GPT-2's
``c_attn``) is one adapter: one A shared by the projections, and B's rows split between them in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.layers.lora import LoRALinear, merged
from qkv.models.description import LoRATarget
from qkv.models.family import family_of

if TYPE_CHECKING:
    from qkv.models.gpt.config import GPTConfig

PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoRASettings:
    """``rank`` r, ``alpha`` (the update is scaled by alpha / r), dropout on the adapter's input, and the targets
    by their PEFT names (``("all",)``: every projection the family names)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise QkvError(f"the LoRA rank must be a positive whole number, got {self.rank!r}: e.g. --lora 8")
        if not self.alpha > 0:
            raise QkvError(f"the LoRA alpha must be above 0, got {self.alpha!r}: e.g. --lora-alpha 16")
        if not 0 <= self.dropout < 1:
            raise QkvError(f"the LoRA dropout must be in [0, 1), got {self.dropout!r}: e.g. --lora-dropout 0.05")


def resolve_targets(model: nn.Module, targets: tuple[str, ...]) -> tuple[str, ...]:
    """The PEFT names to adapt: ``targets`` checked against the family's, ``("all",)`` for all of them, the
    family's default for none. A name the family lacks is a QkvError listing the names it has."""
    family = family_of(model)
    if not family.lora_targets:
        raise QkvError(f"LoRA adapts language models' projections, and this is {family.title}: fine-tune it fully")
    if not targets:
        return family.lora_default
    if tuple(targets) == ("all",):
        return tuple(family.lora_targets)
    unknown = [name for name in targets if name not in family.lora_targets]
    if unknown or len(set(targets)) != len(targets):
        what = f"{unknown[0]!r} is not" if unknown else "each name must appear once, and these are"
        raise QkvError(
            f"--lora-targets: {what} a projection of {family.name} models: choose among "
            f"{', '.join(family.lora_targets)} (or all)"
        )
    return tuple(targets)


def _blocks(model: nn.Module) -> int:
    return int(cast("GPTConfig", model.config).n_layers)  # only the GPT families (GPT, Llama) have LoRA targets


def _targets(model: nn.Module, names: tuple[str, ...]) -> list[tuple[LoRATarget, int]]:
    family = family_of(model)
    return [(family.lora_targets[name], i) for i in range(_blocks(model)) for name in names]


def apply_lora(model: nn.Module, settings: LoRASettings) -> nn.Module:
    """Freeze every parameter of ``model`` and wrap each target projection in a :class:`LoRALinear` (in place);
    returns the model. The base projections may be float or int8 layers."""
    names = resolve_targets(model, settings.targets)
    model.requires_grad_(False)
    for target, i in _targets(model, names):
        shared = None
        for path in target.modules:
            name = path.format(i=i)
            base = model.get_submodule(name)
            if isinstance(base, LoRALinear):
                raise QkvError(f"{name} already has a LoRA adapter: apply LoRA to the base model once")
            layer = LoRALinear(base, settings.rank, settings.alpha, dropout=settings.dropout, shared_a=shared)
            shared = layer.lora_A
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, layer)
    return model


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """Every LoRA layer of ``model`` by module name, in order."""
    return {name: module for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def has_lora(model: nn.Module) -> bool:
    return any(isinstance(module, LoRALinear) for module in model.modules())


def adapted_targets(model: nn.Module) -> tuple[str, ...]:
    """The PEFT names of the targets ``model``'s LoRA layers adapt (in the family's order)."""
    layers = lora_layers(model)
    family = family_of(model)
    return tuple(name for name, t in family.lora_targets.items() if t.modules[0].format(i=0) in layers)


def peft_state(model: nn.Module) -> dict[str, Tensor]:
    """The adapters of ``model`` under PEFT's key names (see the module docstring), float32 on the CPU."""
    layers = lora_layers(model)
    state: dict[str, Tensor] = {}
    for target, i in _targets(model, adapted_targets(model)):
        parts = [layers[path.format(i=i)] for path in target.modules]
        key = PEFT_PREFIX + target.peft.format(i=i)
        state[key + ".lora_A.weight"] = parts[0].lora_A.detach().float().cpu()
        state[key + ".lora_B.weight"] = torch.cat([p.lora_B.detach() for p in parts]).float().cpu()  # (d_out, r)
    return state


def load_peft_state(model: nn.Module, tensors: dict[str, Tensor], *, where: str) -> None:
    """Copy PEFT-named adapters into ``model``'s LoRA layers (the same targets and rank); a missing, extra or
    misshapen tensor is a QkvError naming it and ``where`` it came from."""
    expected = peft_state(model)
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        name, what = (missing[0], "lacks") if missing else (extra[0], "has an extra tensor")
        raise QkvError(f"{where} {what} {name}: the adapter was saved for other targets; check adapter_config.json")
    for key, tensor in tensors.items():
        if tensor.shape != expected[key].shape:
            raise QkvError(
                f"{where}: {key} has shape {list(tensor.shape)}, expected {list(expected[key].shape)}: the adapter "
                "was saved with another rank or for another base model"
            )
    layers = lora_layers(model)
    with torch.no_grad():
        for target, i in _targets(model, adapted_targets(model)):
            parts = [layers[path.format(i=i)] for path in target.modules]
            key = PEFT_PREFIX + target.peft.format(i=i)
            parts[0].lora_A.copy_(tensors[key + ".lora_A.weight"])
            rows = torch.split(tensors[key + ".lora_B.weight"], [p.out_features for p in parts])
            for part, b in zip(parts, rows, strict=True):
                part.lora_B.copy_(b)


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRA layer by a plain Linear holding W + (alpha / r) B A, in place; returns the model.
    Needs float bases: an int8 base has no float matrix to add to (load the float base and merge there)."""
    for name, layer in lora_layers(model).items():
        if _quantized(layer.base):
            raise QkvError(
                f"merging adds B A to the base's float weights, and {name} is quantized: load the float base, "
                "apply the adapters there and merge (qkv merge does)"
            )
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, merged(layer))
    return model


def _quantized(module: nn.Module) -> bool:
    return any(not p.is_floating_point() for p in module.parameters())


class AdapterWeights(nn.Module):
    """A module whose parameters are the adapters of a model (the same tensors): what a LoRA run's checkpoint
    saves and loads, through the same weight files as a whole model (a shared A is stored once)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleDict()
        for name, layer in lora_layers(model).items():
            holder = nn.Module()
            holder.lora_A, holder.lora_B = layer.lora_A, layer.lora_B
            self.layers[name.replace(".", "/")] = holder
