"""The metrics log of a run: one JSON object per line in ``metrics.jsonl`` (and a CSV copy).

Training rows look like ``{"step": 120, "train_loss": 2.31, "lr": 0.0028, "tokens_per_s": 11800}``;
evaluation rows add ``val_loss`` (and, for translation, ``bleu``). ``qkv plot RUN_DIR`` draws them.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from qkv.io import atomic_write_text

METRICS_FILE = "metrics.jsonl"
CSV_FILE = "metrics.csv"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All rows of a run's metrics log (an absent log is empty); a damaged line (cut short by a crash, or
    bytes that are not UTF-8) is skipped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a crash
        if isinstance(row, dict):
            rows.append(row)
    return rows


class MetricsLog:
    """Appends rows to ``metrics.jsonl``; ``enabled=False`` (non-main DDP ranks) writes nothing."""

    def __init__(self, run_dir: str | Path, *, enabled: bool = True) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled

    def write(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")

    def truncate_after(self, step: int) -> None:
        """Drop rows after ``step`` (a resumed run redoes those steps and logs them again)."""
        if self.enabled and self.path.exists():
            rows = [r for r in read_metrics(self.path.parent) if r.get("step", 0) <= step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def write_csv(self) -> Path:
        """Write the log as CSV too (columns: the union of all keys) and return its path."""
        rows = read_metrics(self.path.parent)
        columns = sorted({k for r in rows for k in r}, key=lambda k: (k != "step", k))
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
        path = self.path.parent / CSV_FILE
        atomic_write_text(path, buffer.getvalue())
        return path
