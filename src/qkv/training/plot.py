"""The loss curve of a run as a PNG: training loss per logged step, validation loss per evaluation."""

from __future__ import annotations

from pathlib import Path

from qkv.errors import QkvError
from qkv.training.metrics import read_metrics

PLOT_FILE = "loss.png"


def plot_losses(run_dir: str | Path, out: str | Path | None = None, *, required: bool = True) -> Path | None:
    """Draw ``run_dir``'s metrics log to ``loss.png`` (or ``out``) and return the path.

    A run with no logged loss yet (stopped before its first log line) has no curve: a QkvError, or None
    when not ``required``.
    """
    run_dir = Path(run_dir)
    if required and not run_dir.is_dir():
        raise QkvError(f"{run_dir} does not exist: give the run directory `qkv train` wrote (see its last line)")
    rows = read_metrics(run_dir)
    train = [(r["step"], r["train_loss"]) for r in rows if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
    if not train and not val:
        if not required:
            return None
        raise QkvError(f"{run_dir} has no metrics to plot (no metrics.jsonl rows): train first with `qkv train`")
    from matplotlib.figure import Figure  # no pyplot: the process's backend (a notebook's) stays as it was

    from qkv.io import atomic_write

    fig = Figure(figsize=(7, 4), dpi=110)
    ax = fig.subplots()
    if train:
        ax.plot(*zip(*train, strict=True), label="training loss", color="#4c72b0", alpha=0.8, linewidth=1)
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation loss", color="#dd8452", markersize=4)
    bleu = [(r["step"], r["bleu"]) for r in rows if "bleu" in r]
    if bleu:
        twin = ax.twinx()
        twin.plot(*zip(*bleu, strict=True), "s--", color="#55a868", label="BLEU", markersize=4)
        twin.set_ylabel("BLEU")
        twin.legend(loc="center right")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(run_dir.name)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right")
    fig.tight_layout()
    path = Path(out) if out is not None else run_dir / PLOT_FILE
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
    return path
