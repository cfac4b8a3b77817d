"""bench/gguf_load.py end to end on a tiny Llama's GGUF (no timing assertions): it loads the file both ways in
fresh processes and prints each load's time and peak memory against the float32 model's bytes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gguf_load.py"


def test_the_bench_loads_both_ways_and_prints_its_figures(tmp_path, tiny_llama_dir) -> None:
    pytest.importorskip("gguf")
    import qkv
    from qkv.export.gguf import export_gguf

    bundle = qkv.load(tiny_llama_dir)
    export_gguf(bundle.model, bundle.tokenizer, tmp_path / "tiny.gguf")
    done = subprocess.run([sys.executable, str(BENCH), str(tmp_path / "tiny.gguf"), "--runs", "1"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for mode in ("float32", "quantized"):
        found = re.search(rf"tiny.gguf, {mode}: load ([\d.]+) s .* = ([\d.]+)x the float32 model", done.stdout)
        assert found is not None and float(found[1]) > 0, done.stdout
