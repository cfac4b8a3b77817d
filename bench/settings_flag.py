"""The ``--set KEY=VALUE`` flag of the training benchmarks: any TrainConfig field, or ``model.FIELD``.

Values are JSON (``lr=1e-3``, ``optimizer="adamw"``, ``model.bias=false``); an empty value or ``None``
means None.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_set_argument(parser: argparse.ArgumentParser, example: str) -> None:
    """Add the repeatable ``--set KEY=VALUE`` option; ``example`` shows one use in the help text."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"any other setting: a training field or model.FIELD, e.g. {example}",
    )


def apply_settings(items: list[str], settings: dict[str, Any], model: dict[str, Any]) -> None:
    """Write each ``KEY=VALUE`` of ``items`` into ``settings``, or into ``model`` for ``model.FIELD`` keys."""
    for item in items:
        key, _, raw = item.partition("=")
        value = json.loads(raw) if raw not in ("", "None") else None
        if key.startswith("model."):
            model[key.removeprefix("model.")] = value
        else:
            settings[key] = value
