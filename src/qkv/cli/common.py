"""Helpers shared by the commands: loading a run directory for use, reading prompts and files."""

from __future__ import annotations

import sys
from pathlib import Path

from qkv.checkpoint import ModelBundle, load_model_dir
from qkv.errors import QkvError


def load_for_use(path: str, *, expect: str, device: str = "cpu") -> ModelBundle:
    """Load a run directory (best weights, or the latest checkpoint if none yet) and check its kind.

    ``expect`` is the model kind the command works with ("gpt", "transformer" or "encoder").
    """
    from qkv.training.checkpoint import latest_checkpoint

    run = Path(path)
    weights = None
    if run.is_dir() and not (run / "model.safetensors").exists():
        latest = latest_checkpoint(run)
        if latest is not None:
            print(f"note: {run} has no best model yet; using the latest checkpoint {latest.name}", file=sys.stderr)
            weights = latest / "model.safetensors"
    bundle = load_model_dir(run, device=device, weights_path=weights)
    kind = bundle.config.kind
    if kind != expect:
        use = {"gpt": "qkv generate", "transformer": "qkv translate", "encoder": "qkv embed"}[kind]
        names = {"gpt": "a GPT language model", "transformer": "an encoder-decoder translator", "encoder": "an encoder"}
        raise QkvError(f"{run} holds {names[kind]}, not {names[expect]}: use `{use}` with it")
    return bundle
