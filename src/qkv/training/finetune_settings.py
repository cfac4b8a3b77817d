"""The settings of fine-tuning (``qkv train --from MODEL``, ``--lora RANK``): their defaults and their checks.

A fine-tuned model keeps the pretrained model's shape and tokenizer, so the settings that would choose them
(a preset, an architecture, a tokenizer, model fields) are refused in one line. What a fine-tuning run does by
default differs from training from scratch: AdamW (the optimizer the pretrained weights were trained with;
Muon orthogonalises whole matrices, which LoRA's low-rank factors are not), a learning rate a pretrained model
tolerates (5e-5 for every weight, 5e-4 for LoRA's adapters, whose B starts at zero) after a short warmup, short
sequences and fewer, smaller evaluations, so that a run takes minutes on a CPU.
"""

from __future__ import annotations

from typing import Any

from qkv.errors import QkvError
from qkv.training.flags import setting

FINETUNE_DEFAULTS: dict[str, Any] = dict(
    optimizer="adamw",
    lr=5e-5,
    warmup_steps=20,
    weight_decay=0.0,
    steps=200,
    batch_size=4,
    eval_interval=50,
    eval_batches=8,
    log_interval=5,
)
LORA_DEFAULTS: dict[str, Any] = dict(lr=5e-4)
DEFAULT_SEQ_LEN = 256  # tokens per sequence with --from unless --seq-len says (a model's context may be 8192)
BASE_QUANTIZATIONS = ("int8",)
LORA_FIELDS = ("lora_alpha", "lora_dropout", "lora_targets", "quantize_base", "base_group_size")
SHAPE_FIELDS = ("preset", "arch", "tokenizer", "vocab_size")


def finetune_defaults(settings: dict[str, Any]) -> dict[str, Any]:
    """The defaults of a fine-tuning run (nothing for a run from scratch)."""
    if not settings.get("init_from"):
        return {}
    return {**FINETUNE_DEFAULTS, **(LORA_DEFAULTS if settings.get("lora") else {})}


def lora_alpha(config: Any) -> float:
    """The adapters' alpha: as given, else 2 r (an update scaled by 2, a common choice with PEFT)."""
    return float(config.lora_alpha) if config.lora_alpha is not None else 2.0 * config.lora


def lora_target_names(config: Any) -> tuple[str, ...]:
    """``--lora-targets q_proj,v_proj`` as a tuple of names (empty: the family's default)."""
    return tuple(name.strip() for name in (config.lora_targets or "").split(",") if name.strip())


def check_finetune(config: Any, defaults: dict[str, Any]) -> None:
    """QkvError for settings that do not go together with ``--from`` / ``--lora`` (``defaults``: each field's)."""
    n = setting
    given = [name for name in LORA_FIELDS if getattr(config, name) != defaults[name]]
    if isinstance(config.lora, bool) or not isinstance(config.lora, int) or config.lora < 0:
        raise QkvError(
            f"{n('lora')} is LoRA's rank, a positive whole number (e.g. {n('lora', 8)}), got {config.lora!r}"
        )
    if config.seq_len is not None and (isinstance(config.seq_len, bool) or not isinstance(config.seq_len, int)
                                       or config.seq_len < 1):  # fmt: skip
        raise QkvError(f"{n('seq_len')} must be a positive whole number of tokens, got {config.seq_len!r}")
    if not config.init_from:
        if config.lora or given:
            flags = ", ".join(n(name) for name in (["lora"] if config.lora else []) + given)
            raise QkvError(f"{flags} adapt a pretrained model: add {n('init_from')} MODEL (a run, a folder or a .gguf)")
        return
    if config.task != "lm":
        raise QkvError(f"{n('init_from')} fine-tunes language models: drop {n('task', config.task)}")
    if config.model:
        flags = ", ".join("--" + name.replace("_", "-") for name in config.model)
        raise QkvError(f"{n('init_from')} keeps the pretrained model's shape: drop {flags}")
    shape = [name for name in SHAPE_FIELDS if getattr(config, name) != defaults[name]]
    if shape:
        flags = ", ".join(n(name) for name in shape)
        raise QkvError(f"{n('init_from')} keeps the pretrained model's architecture and tokenizer: drop {flags}")
    if not config.lora:
        if given:
            raise QkvError(f"{', '.join(n(name) for name in given)} set up LoRA: add {n('lora')} RANK (e.g. 8)")
        return
    _check_lora(config)


def _check_lora(config: Any) -> None:
    n = setting
    if config.lora_alpha is not None and not config.lora_alpha > 0:
        raise QkvError(
            f"{n('lora_alpha')} must be above 0 (the update is scaled by alpha / rank), got {config.lora_alpha}"
        )
    if not 0 <= config.lora_dropout < 1:
        raise QkvError(f"{n('lora_dropout')} must be in [0, 1), got {config.lora_dropout}: e.g. 0.05")
    if config.quantize_base is not None and config.quantize_base not in BASE_QUANTIZATIONS:
        raise QkvError(
            f"{n('quantize_base', config.quantize_base, bad=True)} is unknown: the frozen base can be int8 "
            f"({n('quantize_base', 'int8')})"
        )
    if config.base_group_size is not None:
        if config.quantize_base is None:
            raise QkvError(
                f"{n('base_group_size', config.base_group_size)} sizes the groups of an int8 base: add "
                f"{n('quantize_base', 'int8')}"
            )
        group = config.base_group_size
        if isinstance(group, bool) or not isinstance(group, int) or group < 0 or group % 32:
            raise QkvError(
                f"{n('base_group_size', group, bad=True)} must be 0 (a scale per row) or a multiple of 32 (32 is "
                f"GGUF's Q8_0 block): e.g. {n('base_group_size', 32)}"
            )
    if config.strategy == "fsdp":
        raise QkvError(
            f"{n('strategy', 'fsdp')} shards every weight for full fine-tuning; LoRA's adapters are small: drop "
            f"{n('strategy')} (LoRA trains under DDP) or drop {n('lora')}"
        )
    if config.optimizer != "adamw":
        raise QkvError(
            f"LoRA's low-rank factors train with AdamW ({n('optimizer', config.optimizer)} is for whole weight "
            f"matrices): use {n('optimizer', 'adamw')}, the default with {n('lora')}"
        )
