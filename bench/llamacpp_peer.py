"""llama.cpp (through llama-cpp-python's low-level API) in a process of its own, driven over stdin/stdout by
bench/llamacpp.py. It never imports torch: each engine runs alone in its process, with its own threads (bench/
ct2_peer.py says why co-hosting two OpenMP runtimes skews both).

Protocol, one JSON object per line; every request names a GGUF ``file``, loaded once and kept:

- ``{"op": "quantize", "source": F32_FILE, "file": OUT, "type": "Q8_0" | "Q4_0" | "Q4_1"}`` -> ``{"ok": true}``
- ``{"op": "decode", "file", "prompts": [[ids]...], "new": n}``: the prompts as sequences 0..B-1 of one batch
  (prefill), then n - 1 steps of B tokens in one ``llama_decode`` each, greedy -> ``{"ids", "prefill_s",
  "decode_s"}``
- ``{"op": "prefill", "file", "ids": [...]}``: one prompt in one batch -> ``{"seconds"}``
- ``{"op": "score", "file", "windows": [[ids]...]}``: each window in one batch with every position's logits
  -> ``{"nll": total over next tokens, "count", "argmax": [[ids]...]}``

    python bench/llamacpp_peer.py THREADS     # started by bench/llamacpp.py
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import numpy as np

_QUIET = None  # the log callback that silences llama.cpp
CONTEXT = 4096  # cache cells: 8 sequences of 32 + 128, a 512-token prefill, a 512-token window
SEQUENCES = 8


class Engine:
    """One GGUF model and a context of ``CONTEXT`` cells for up to 8 sequences."""

    def __init__(self, llama, path: str, threads: int) -> None:
        self.L = llama
        params = llama.llama_model_default_params()
        self.model = llama.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        cparams = llama.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = CONTEXT, 512, 512
        cparams.n_seq_max, cparams.n_threads, cparams.n_threads_batch = SEQUENCES, threads, threads
        cparams.no_perf = True
        self.ctx = llama.llama_init_from_model(self.model, cparams)
        self.vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(self.model))
        self.batch = llama.llama_batch_init(CONTEXT, 0, SEQUENCES)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def run(self, tokens: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """One llama_decode of (token, position, sequence, wants logits) entries; the logits asked for, in order."""
        for start in range(0, len(tokens), 512):  # n_batch at a time
            part = tokens[start : start + 512]
            b = self.batch
            b.n_tokens = len(part)
            for i, (token, pos, seq, logits) in enumerate(part):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
                b.seq_id[i][0] = seq
            if self.L.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            wanted = sum(1 for entry in part if entry[3])
            if wanted and start + 512 >= len(tokens):
                pointer = self.L.llama_get_logits(self.ctx)
                return np.ctypeslib.as_array(pointer, shape=(wanted, self.vocab)).copy()
            if wanted:
                raise ValueError("logits are read from the last 512 tokens only")
        return np.empty((0, self.vocab), np.float32)

    def decode(self, prompts: list[list[int]], new: int) -> dict:
        self.clear()
        start = time.perf_counter()
        entries = [(t, p, s, p == len(prompt) - 1) for s, prompt in enumerate(prompts) for p, t in enumerate(prompt)]
        logits = self.run(entries)
        made = [[int(i)] for i in logits.argmax(axis=1)]
        prefilled = time.perf_counter()
        for step in range(new - 1):
            entries = [(row[-1], len(prompts[s]) + step, s, True) for s, row in enumerate(made)]
            for row, token in zip(made, self.run(entries).argmax(axis=1), strict=True):
                row.append(int(token))
        done = time.perf_counter()
        return {"ids": made, "prefill_s": prefilled - start, "decode_s": done - prefilled}

    def prefill(self, ids: list[int]) -> dict:
        self.clear()
        start = time.perf_counter()
        self.run([(t, p, 0, p == len(ids) - 1) for p, t in enumerate(ids)])
        return {"seconds": time.perf_counter() - start}

    def score(self, windows: list[list[int]]) -> dict:
        nll, count, argmax = 0.0, 0, []
        for window in windows:
            self.clear()
            logits = self.run([(t, p, 0, True) for p, t in enumerate(window)]).astype(np.float64)
            top = logits.max(axis=1, keepdims=True)
            logsum = top[:, 0] + np.log(np.exp(logits - top).sum(axis=1))
            targets = np.array(window[1:])
            nll += float((logsum[:-1] - logits[np.arange(len(targets)), targets]).sum())
            count += len(targets)
            argmax.append(logits[:-1].argmax(axis=1).tolist())
        return {"nll": nll, "count": count, "argmax": argmax}


def quantize(llama, source: str, out: str, kind: str) -> None:
    params = llama.llama_model_quantize_default_params()
    params.ftype = getattr(llama, f"LLAMA_FTYPE_MOSTLY_{kind}")
    if llama.llama_model_quantize(source.encode(), out.encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize {source} -> {kind} failed")


def main(threads: int) -> None:
    import llama_cpp

    global _QUIET
    _QUIET = llama_cpp.llama_log_callback(lambda level, text, data: None)  # kept alive: llama.cpp calls it later
    llama_cpp.llama_log_set(_QUIET, ctypes.c_void_p())
    llama_cpp.llama_backend_init()
    engines: dict[str, Engine] = {}
    print(json.dumps({"ready": llama_cpp.__version__, "system": llama_cpp.llama_print_system_info().decode()}))
    sys.stdout.flush()
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "quantize":
            quantize(llama_cpp, request["source"], request["file"], request["type"])
            print(json.dumps({"ok": True}), flush=True)
            continue
        if request["file"] not in engines:
            engines[request["file"]] = Engine(llama_cpp, request["file"], threads)
        engine = engines[request["file"]]
        if op == "decode":
            answer = engine.decode(request["prompts"], request["new"])
        elif op == "prefill":
            answer = engine.prefill(request["ids"])
        else:
            answer = engine.score(request["windows"])
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
