"""bench/finetune.py end to end on a tiny Llama (no timing assertions): both sides train on the same batches, and
from the same adapters the two loss curves are the same curve."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

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


def test_under_bfloat16_autocast_both_sides_compute_the_same_lora_curve(tmp_path, tiny_llama_dir) -> None:
    """--precision bf16: qkv's frozen products in bfloat16 (a copy of each matrix made once) against the peer's
    autocast: the same loss to a bfloat16 step."""
    out = bench(tmp_path, tiny_llama_dir, "--modes", "lora", "--precision", "bf16")
    assert "bf16" in out.splitlines()[0], out
    assert "ratio of each round" not in out, out  # one round: no per-round line
    first = re.search(r"lora: loss of the first batch qkv ([\d.]+), peer ([\d.]+)", out)
    assert abs(float(first[1]) - float(first[2])) < 2e-2 * float(first[2]), out
    gap = re.search(r"lora: mean loss of the last 3 steps .*relative difference ([\d.]+)%", out)
    assert float(gap[1]) < 2, out


def test_rounds_alternate_the_sides_and_merge_their_steps(tmp_path, monkeypatch, capsys) -> None:
    """--rounds 3 runs qkv, peer, then peer, qkv, then qkv, peer (a drift of the machine's speed moves both sides
    alike), prints each round's ratio, and reports every round's steps after its first with the first round's
    losses and the highest peak memory. The workers' results are made up here (the tests above run real ones)."""
    spec = importlib.util.spec_from_file_location("bench_finetune", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    order = []

    def run_side(args, side, mode, work):  # noqa: ANN001, ANN202
        order.append(side)
        n = len(order)
        slow = 2.0 if side == "qkv" else 4.0
        return {"times": [9.0, slow * n, slow * n], "cpu": [1.0, 1.0], "faults": [5, 5, 5], "peak_mb": 100.0 + n,
                "losses": [3.0 + n, 2.0, 1.0]}  # fmt: skip

    monkeypatch.setattr(module, "run_side", run_side)
    module.main(["--model", str(tmp_path), "--modes", "lora", "--steps", "3", "--rounds", "3"])
    out = capsys.readouterr().out
    assert order == ["qkv", "peer", "peer", "qkv", "qkv", "peer"], order
    # round by round: qkv 2 x 1 against peer 4 x 2, qkv 2 x 4 against peer 4 x 3, qkv 2 x 5 against peer 4 x 6
    assert "lora: step time ratio of each round: 0.250, 0.667, 0.417\n" in out, out
    # qkv's merged steps 2, 2, 8, 8, 10, 10 (median 8), the peer's 8, 8, 12, 12, 24, 24 (median 12)
    assert "step time qkv 8.000 s, peer 12.000 s: ratio 0.667" in out, out
    assert "peak memory while training qkv 105 MB, peer 106 MB" in out, out
    assert "loss of the first batch qkv 4.00000, peer 5.00000" in out, out
