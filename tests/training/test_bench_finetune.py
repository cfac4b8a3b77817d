"""bench/finetune.py end to end on a tiny Llama (no timing assertions): both sides train on the same batches, and
from the same adapters the two loss curves are the same curve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "finetune.py"
TEXT = "the cat sat on the mat and the dog sat on the log. " * 60


def bench(tmp_path, model_dir, *options: str) -> str:  # noqa: ANN001
    """The bench's output for a tiny run (3 steps of 2 x 16 tokens unless ``options`` say otherwise)."""
    (tmp_path / "text.txt").write_text(TEXT)
    command = [sys.executable, str(BENCH), "--model", str(model_dir), "--data", str(tmp_path / "text.txt"),
               "--steps", "3", "--seq-len", "16", "--batch-size", "2", "--threads", "1", "--lr", "1e-2",
               *options]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_bench_prints_its_ratios_and_the_curves_agree(tmp_path, tiny_llama_dir) -> None:
    out = bench(tmp_path, tiny_llama_dir)
    for mode in ("lora", "full"):
        assert re.search(rf"{mode}: step time qkv [\d.]+ s, peer [\d.]+ s: ratio [\d.]+", out), out
        assert re.search(rf"{mode}: peak memory while training qkv \d+ MB, peer \d+ MB", out), out
        assert re.search(rf"{mode}: page faults per step qkv \d+, peer \d+ ", out), out
        first = re.search(rf"{mode}: loss of the first batch qkv ([\d.]+), peer ([\d.]+)", out)
        assert abs(float(first[1]) - float(first[2])) < 1e-4, out
        gap = re.search(rf"{mode}: mean loss of the last 3 steps .*relative difference ([\d.]+)%", out)
        assert float(gap[1]) < 0.1, out


def test_under_bfloat16_autocast_both_sides_compute_the_same_lora_curve_in_each_round(tmp_path, tiny_llama_dir) -> None:
    """--precision bf16: qkv's frozen products in bfloat16 (a copy of each matrix made once) against the peer's
    autocast: the same loss to a bfloat16 step. --rounds 2 runs each side twice and prints each round's ratio."""
    out = bench(tmp_path, tiny_llama_dir, "--modes", "lora", "--precision", "bf16", "--rounds", "2")
    assert "bf16" in out.splitlines()[0], out
    assert re.search(r"lora: step time ratio of each round: [\d.]+, [\d.]+\n", out), out
    first = re.search(r"lora: loss of the first batch qkv ([\d.]+), peer ([\d.]+)", out)
    assert abs(float(first[1]) - float(first[2])) < 2e-2 * float(first[2]), out
    gap = re.search(r"lora: mean loss of the last 3 steps .*relative difference ([\d.]+)%", out)
    assert float(gap[1]) < 2, out
