"""How a message names a training setting: as a ``qkv train`` flag on the command line (``--warmup-steps 500``),
as the field of :class:`~qkv.training.config.TrainConfig` from Python (``warmup_steps=500``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

_AS_FLAGS: ContextVar[bool] = ContextVar("qkv_settings_as_flags", default=False)
FLAG_NAMES = {"out_dir": "--out", "max_tokens": "--batch-tokens", "init_from": "--from"}
"""Settings whose `qkv train` flag is not the field's name with dashes (the old spellings remain aliases)."""
_UNSET = object()


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """Inside this block, messages about settings name them as ``qkv train`` flags (the command line's view)."""
    token = _AS_FLAGS.set(True)
    try:
        yield
    finally:
        _AS_FLAGS.reset(token)


def setting(name: str, value: Any = _UNSET, *, bad: bool = False) -> str:
    """A setting as a message names it: ``--warmup-steps 500`` under :func:`flag_names` (the command line),
    ``warmup_steps=500`` from Python. ``bad``: the value is the user's, quoted when it is a string."""
    if not _AS_FLAGS.get():
        return name if value is _UNSET else f"{name}={value!r}"
    flag = FLAG_NAMES.get(name) or "--" + name.replace("_", "-")
    return flag if value is _UNSET else f"{flag} {value!r}" if bad else f"{flag} {value}"
