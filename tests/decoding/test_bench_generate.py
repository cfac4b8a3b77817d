"""The generation benchmark script runs and measures what it says (no timing assertions)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "generate.py"


def load_bench(path: Path = BENCH) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_benchmark_measures_positive_speeds_and_identical_tokens() -> None:
    bench = load_bench()
    model = bench.build_model("gpt-nano", vocab_size=64)
    m = bench.measure(model, 8, 8)
    assert m.cached_tokens_per_second > 0 and m.uncached_tokens_per_second > 0 and m.speedup > 0
    assert m.same_tokens


def test_benchmark_main_prints_a_table(capsys) -> None:
    bench = load_bench()
    assert bench.main(["--preset", "gpt-nano", "--vocab-size", "64", "--lengths", "8+8", "60+8", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "speed-up" in out and "8+8" in out and "past the 64-token context" in out


def test_gpu_benchmark_runs_its_reduced_cpu_mode_and_matches_transformers() -> None:
    bench = load_bench(BENCH.with_name("generate_gpu.py"))
    rows = bench.measure(
        2, torch.float32, ("static", "model"), full=False, device=torch.device("cpu"), prompt_len=5, new=4, repeats=1
    )
    assert [r["engine"] for r in rows] == ["transformers", "static", "model"]
    assert all(r["same_tokens"] and r["tokens_per_s"] > 0 and r["first_call_s"] > 0 for r in rows)
