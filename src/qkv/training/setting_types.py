"""A training setting's value against the type of its :class:`~qkv.training.config.TrainConfig` field.

A TOML file or a dict of settings can hold anything (``lr = "fast"``, ``steps = 1.5``, ``lr = nan``):
:func:`check_type` refuses such a value with a QkvError that names the setting and the kind of value it takes,
before the value reaches the optimizer.
"""

from __future__ import annotations

import math
from typing import Any

from qkv.errors import QkvError

_TYPE_WORDS = {"int": "a whole number", "float": "a number", "str": "a string", "bool": "true or false"}


def check_type(name: str, value: Any, annotation: object) -> None:
    """QkvError naming the setting when ``value`` does not have the field's type (a TOML ``lr = "fast"``)."""
    wanted = [part.strip() for part in str(annotation).split("|")]
    if value is None and "None" in wanted:
        return
    base = wanted[0]
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
        "str": isinstance(value, str) or (name == "compile" and isinstance(value, bool)),  # TOML's compile = true
        "bool": isinstance(value, bool),
    }.get(base, isinstance(value, dict) if base.startswith("dict") else True)
    if not ok:
        finite = base == "float" and isinstance(value, float)  # nan or inf: a number, but not one to train with
        words = "a finite number" if finite else _TYPE_WORDS.get(base, "a table")
        raise QkvError(f"setting {name} = {value!r} must be {words}: fix it in the TOML file or flag")
