"""A ``qkv train --config`` TOML file: the settings it holds, each value checked against its field's type.

The file uses the same names as the flags (``lr = 3e-3``, ``batch-size = 32``) plus a ``[model]`` table for
architecture fields (``[model] d_model = 256``); :func:`read_toml` turns it into the settings that
:meth:`~qkv.training.config.TrainConfig.create` takes.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

from qkv.errors import QkvError
from qkv.training.config import TrainConfig
from qkv.training.setting_types import check_type


def read_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file: top-level keys are training fields, ``[model]`` holds architecture fields.
    Each training field's type is checked here, so that a wrong value is named even when a flag replaces it."""
    from qkv.io import read_text

    text = read_text(path, what="config file")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise QkvError(f"config file {path} is not valid TOML ({error}): fix the line it names") from None
    settings = {key.replace("-", "_"): value for key, value in data.items()}
    types = {f.name: f.type for f in fields(TrainConfig)}
    for name, value in settings.items():  # each value, also one a flag will override
        if name in types and name != "model":  # [model] is checked with the model's own fields
            try:
                check_type(name, value, types[name])
            except QkvError as error:
                raise QkvError(f"config file {path}: {error}") from None
    return settings
