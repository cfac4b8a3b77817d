"""The loss curve: drawn from the metrics log; a run with no logged loss has none to draw."""

from __future__ import annotations

import json

import pytest

from qkv.errors import QkvError
from qkv.training.metrics import METRICS_FILE
from qkv.training.plot import PLOT_FILE, plot_losses


def test_a_log_without_losses_has_no_curve(tmp_path) -> None:
    (tmp_path / METRICS_FILE).write_text(json.dumps({"step": 1, "lr": 1e-3}) + "\n", encoding="utf-8")
    with pytest.raises(QkvError, match="no metrics to plot"):
        plot_losses(tmp_path)  # `qkv plot RUN` asks for a curve: one clear message
    assert plot_losses(tmp_path, required=False) is None  # the end of training only draws one if there is one
    assert not (tmp_path / PLOT_FILE).exists()


def test_losses_are_drawn_to_a_png(tmp_path) -> None:
    rows = [{"step": s, "train_loss": 3.0 / s} for s in range(1, 6)] + [{"step": 5, "val_loss": 0.9, "bleu": 12.0}]
    (tmp_path / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    path = plot_losses(tmp_path, required=False)
    assert path == tmp_path / PLOT_FILE
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
