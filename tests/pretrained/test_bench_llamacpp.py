"""bench/llamacpp.py's parts that need no llama.cpp (which pip builds from source, outside CI): the fp32 step's
share of the memory's speed, the bytes a step reads, and a peer that dies of an illegal instruction."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))  # as `python bench/llamacpp.py` has it
    import llamacpp
    import qkv_peer

    return llamacpp, qkv_peer


def test_the_fp32_step_is_measured_against_a_plain_read(bench, monkeypatch) -> None:
    llamacpp, qkv_peer = bench
    runs = {("qkv", "fp32", 1): {"rates": [40.0, 50.0, 45.0]}, "read GB/s sustained": [25.0, 22.5, 24.0],
            "read GB/s best": [30.0, 25.0, 28.0]}  # fmt: skip
    line = llamacpp.bandwidth_line(runs, 500_000_000, 2)
    assert "reads 500 MB of weights a token: 22.5 GB/s, 94% of a plain read sustained over the same bytes, " in line
    assert "24.0 (22.5-25.0) GB/s (torch.sum over 512 MiB, 2 threads), and 80% of its fastest single read, 28.0" in line
    read = qkv_peer.read_bandwidth(mib=16, repeats=2)
    assert 0.1 < read["sustained"] <= read["best"] < 10_000  # GB/s: some real reading
    calls = []
    monkeypatch.setattr(qkv_peer, "_c_read", lambda: lambda x: calls.append(1) or float(x.sum()))
    qkv_peer.read_bandwidth(mib=1, repeats=2, sustained_bytes=5 * 2**20 + 1)
    assert len(calls) == 6  # enough whole reads for the bytes asked
    qkv_peer.read_bandwidth(mib=1, repeats=2)
    assert len(calls) == 8  # at least `repeats`


def test_a_step_reads_each_weight_once_a_tied_unembedding_too(bench) -> None:
    _, qkv_peer = bench
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied, as SmolLM2's
    assert qkv_peer.weight_bytes(model) == 10 * 4 * 4
    assert qkv_peer.weight_bytes(model.half()) == 10 * 4 * 2


def test_a_peer_killed_by_an_illegal_instruction_says_how_to_rebuild_llama_cpp(bench, tmp_path) -> None:
    llamacpp, _ = bench
    script = tmp_path / "llamacpp_peer.py"
    script.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    with pytest.raises(SystemExit) as stop:
        llamacpp.Peer([str(script)])
    message = str(stop.value)
    assert message.startswith("llamacpp_peer.py ended early (exit code -4)"), message
    assert "-DGGML_AMX_INT8=OFF" in message and "\n" not in message
    other = tmp_path / "other.py"
    other.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(SystemExit, match=r"^other.py ended early \(exit code 3\)$"):
        llamacpp.Peer([str(other)])


def test_the_run_says_which_step_each_width_ran(bench) -> None:
    """A native library that failed to build leaves qkv on the PyTorch step: the line names the widths it slowed."""
    llamacpp, _ = bench
    runs = {("qkv", "fp32", 1): {"mode": "native"}, ("qkv", "int8", 1): {"mode": "native"},
            ("qkv", "int8", 8): {"mode": "static"}, ("llama.cpp", "F32", 1): {"mode": None},
            "read with": "C"}  # fmt: skip
    assert llamacpp.steps(runs) == "native at every width"
    runs[("qkv", "int8", 1)]["mode"] = "static"
    assert llamacpp.steps(runs) == "fp32 native, int8 static"
