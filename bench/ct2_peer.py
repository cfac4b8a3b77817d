"""CTranslate2 in a process of its own, driven over stdin/stdout by bench/pretrained.py.

Why a separate process: CTranslate2's wheel brings its own OpenMP runtime. Once it has run in the same process
as torch, torch's worker threads no longer spin between operators (the process now manages more OpenMP
threads than it has cores, and libgomp throttles its spinning), and qkv's batch-1 decoding fell from 50 to
37 tokens/s on the 2-core machine while CTranslate2's own speed barely moved. Users run one library or the
other, never both in one process, so each runs in its own process and the turns alternate between them;
this process never imports torch.

Protocol, one JSON object per line:
- in: ``{"kind": "float32" | "int8", "prompt": [[ids...], ...], "new_tokens": n}``
- out: ``{"ids": [[new ids...], ...]}`` (the continuation only, without the prompt)

    python bench/ct2_peer.py CT2_FOLDER THREADS     # started by bench/pretrained.py, not by hand
"""

from __future__ import annotations

import json
import sys


def main(folder: str, threads: int) -> None:
    import ctranslate2

    generators = {
        kind: ctranslate2.Generator(folder, device="cpu", compute_type=kind, intra_threads=threads)
        for kind in ("float32", "int8")
    }
    print(json.dumps({"ready": ctranslate2.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        start = [[f"t{i}" for i in row] for row in request["prompt"]]
        n = request["new_tokens"]
        results = generators[request["kind"]].generate_batch(
            start, max_length=n, min_length=n, sampling_topk=1, include_prompt_in_result=False
        )
        print(json.dumps({"ids": [r.sequences_ids[0] for r in results]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
