"""A LoRA run's adapters folded into its base: a whole model folder (``qkv merge``).

Each adapted projection becomes one plain matrix, W' = W + (alpha / r) B A, so the folder (config.json,
model.safetensors, tokenizer.json, chat_template.jinja) opens in every verb without the base or the adapters, and
``qkv export --gguf`` writes it as one GGUF file. A run trained over an int8 base is merged into the float base:
the adapters learned to correct the int8 model, so the merged model differs from it by about that rounding.
"""

from __future__ import annotations

from pathlib import Path

import torch

from qkv.adapter_dir import is_adapter_dir
from qkv.errors import QkvError
from qkv.loading import load
from qkv.model_dir import CONFIG_FILE, save_model_dir


def merge_run(run_dir: str | Path, out: str | Path, *, force: bool = False, device: str | torch.device = "cpu") -> Path:
    """Write the model of the LoRA run (or PEFT adapter folder) ``run_dir`` with its adapters merged into ``out``;
    returns ``out``. A model already in ``out`` is replaced only with ``force``."""
    run_dir, out = Path(run_dir), Path(out)
    if not is_adapter_dir(run_dir):
        raise QkvError(f"{run_dir} holds no LoRA adapters (no adapter_config.json): give a run trained with --lora")
    if out.exists() and out.resolve() == run_dir.resolve():
        raise QkvError(f"--out {out} is the run itself: write the merged model to another folder")
    if (out / CONFIG_FILE).exists() and not force:
        raise QkvError(f"{out} already holds a model: add --force to replace it, or choose another --out")
    bundle = load(run_dir, device=device, merge_adapters=True)
    return save_model_dir(out, bundle.model, bundle.tokenizer, chat_template=bundle.chat_template)
