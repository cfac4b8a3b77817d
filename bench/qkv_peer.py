"""qkv in a process of its own, driven over stdin/stdout by bench/llamacpp.py (the llama.cpp side is
bench/llamacpp_peer.py): the same requests, answered by qkv's decoding engine.

Widths, each made once from the shipped Q4_1 file and kept:

- ``fp32``: ``qkv.load(file, dequantize=True)``, the file's numbers in float32 (llama.cpp's F32 file holds the same);
- ``int8``, ``w8a8``: fp32 quantized by ``qkv.load(file, quantize="int8", group_size=0)`` (a scale per output
  channel), weight-only and with int8 activations (``activations="int8"``, which first smooths the inputs' large
  channels into the weights, as ``qkv quantize --activations int8`` does, and rounds W_2's and W_U's inputs
  twice); ``int8-g32``, ``w8a8-g32``: a scale per group of 32 weights (``group_size=32``, the default here), as
  llama.cpp's Q8_0 blocks;
- ``int4``: ``qkv.load(file)``, the file's own Q4_1 blocks as int4 layers (the same numbers as llama.cpp's Q4_1),
  weight-only: x stays float;
- ``int4-q4_0``: ``qkv.load`` of the Q4_0 file llama.cpp's quantizer made; ``fp32-q4_0``: that file's numbers in
  float32 (``dequantize=True``), the float model the Q4_0 widths compute;
- ``w4a8``, ``w4a8-q4_0``: the same layers with ``set_activations(model, "int8")``: x rounded to int8 in blocks of
  32, as llama.cpp's Q4 x Q8 products do (twice for W_2 and W_U);
- ``w8a8x2``, ``w8a8x2-g32``, ``w4a8x2``, ``w4a8x2-q4_0``: as w8a8 and w4a8 with ``activations="int8x2"``, x rounded
  twice (what the first rounding missed, rounded again; not smoothed).

Requests (one JSON object per line) as bench/llamacpp_peer.py's, with ``width`` instead of ``file``, plus
``{"op": "export", "file": OUT, "type": "f32" | "f16"}`` (qkv's ``export_gguf`` of fp32) and
``{"op": "encode", "text": ...}``. ``score`` runs the windows teacher-forced through the decode step generation
uses (the native step where it runs), all windows as one batch, one position per step.

    python bench/qkv_peer.py THREADS Q4_1_FILE Q4_0_FILE STEP    # started by bench/llamacpp.py
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from qkv import native


class Widths:
    """The models of each width, made on first use."""

    def __init__(self, q4_1: str, q4_0: str) -> None:
        self.files, self.models, self.bundle = {"int4": q4_1, "int4-q4_0": q4_0}, {}, None

    def fp32(self):
        import qkv

        if self.bundle is None:
            self.bundle = qkv.load(self.files["int4"], dequantize=True)
        return self.bundle

    def __getitem__(self, width: str) -> torch.nn.Module:
        if width not in self.models:
            import qkv
            from qkv.quantization import set_activations

            x = "float" if width.startswith(("int", "fp")) else "int8x2" if "a8x2" in width else "int8"
            if width == "fp32":
                model = self.fp32().model
            elif width == "fp32-q4_0":
                model = qkv.load(self.files["int4-q4_0"], dequantize=True).model
            elif width.startswith(("int8", "w8a8")):  # per row, or -g32: a scale per 32 weights (as Q8_0)
                group = 32 if width.endswith("-g32") else 0
                model = qkv.load(self.files["int4"], quantize="int8", group_size=group, activations=x).model
            else:  # int4, int4-q4_0 (weight-only), w4a8(x2), w4a8(x2)-q4_0 (x rounded to int8 too)
                model = qkv.load(self.files[width.replace("w4a8x2", "int4").replace("w4a8", "int4")]).model
                set_activations(model, x)
            self.models[width] = model
        return self.models[width]


def decode(model, prompts: list[list[int]], new: int, step: str) -> dict:
    from qkv.decoding import Engine, Request, SamplingParams

    engine = Engine(model, len(prompts), max(map(len, prompts)) + new, step=step)
    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)
    requests = [Request(list(p), params) for p in prompts]
    made = {id(r): [] for r in requests}
    start = time.perf_counter()
    outputs = engine.add(requests)
    prefilled = time.perf_counter()
    while outputs:
        for out in outputs:
            if out.error is not None:
                raise out.error
            made[id(out.request)].append(out.token)
        outputs = engine.step()
    done = time.perf_counter()
    return {"ids": [made[id(r)] for r in requests], "prefill_s": prefilled - start, "decode_s": done - prefilled,
            "mode": engine.mode}  # fmt: skip


def prefill(model, ids: list[int], step: str) -> dict:
    from qkv.decoding import Engine, Request, SamplingParams

    engine = Engine(model, 1, len(ids) + 1, step=step)
    start = time.perf_counter()
    engine.add([Request(list(ids), SamplingParams(max_new_tokens=1, temperature=0.0))])
    return {"seconds": time.perf_counter() - start}


def score(model, windows: list[list[int]], step: str) -> dict:
    """Teacher-forced next-token NLL and argmax of every window, one position per decode step."""
    from qkv.decoding.decode_step import gpt_step
    from qkv.decoding.fast_step import fast_step_for, resolve_step

    ids = torch.tensor(windows)  # (B, W): the windows share their positions
    batch, width = ids.shape
    config, fast = model.config, fast_step_for(model)
    cache = model.new_cache(width).allocate(batch, config.n_kv_heads, config.head_dim, dtype=torch.float32,
                                            device="cpu")  # fmt: skip
    native = resolve_step(model, step) == "native"
    nll, argmax = 0.0, []
    with torch.no_grad():
        for t in range(width - 1):
            position = torch.full((batch,), t, dtype=torch.long)
            if native:
                logits = fast.native()(ids[:, t], position, cache)
            else:
                logits = gpt_step(model, fast.projections, ids[:, t], position[:1], cache.unbind(0), t + 1)
            logp = torch.log_softmax(logits.double(), dim=-1)
            nll -= logp.gather(1, ids[:, t + 1, None]).sum().item()
            argmax.append(logits.argmax(dim=-1))
    return {"nll": nll, "count": batch * (width - 1), "argmax": torch.stack(argmax, dim=1).tolist()}


def read_bandwidth(mib: int = 512, repeats: int = 7, sustained_bytes: int = 0) -> dict[str, float]:
    """GB/s of a plain read of a float32 tensor of ``mib`` MiB (too large for the caches): what this process's
    threads read from memory when they do nothing else. "best": the fastest of ``repeats`` reads (a quiet moment
    of the host's, about 20 ms); "sustained": the mean rate of back-to-back reads of ``sustained_bytes`` in all
    (at least ``repeats`` reads), measured as a decode is, over the same bytes (the weights times the tokens) and
    so through the same moments of the host's. The read is bench/read_memory.c's loop where a C compiler is at hand
    (torch.sum reads less: 20-24 GB/s where that loop read 23-36), else torch.sum."""
    data = torch.ones(mib * 2**20 // 4)
    read = _c_read() or (lambda x: float(x.sum()))
    reads = max(repeats, math.ceil(sustained_bytes / (data.numel() * 4)))
    times = []
    for _ in range(reads):
        start = time.perf_counter()
        total = read(data)
        times.append(time.perf_counter() - start)
    assert total == data.numel(), "the read summed every value"
    return {"best": data.numel() * 4 / min(times) / 1e9, "sustained": reads * data.numel() * 4 / sum(times) / 1e9}


def read_kind() -> str:
    """What :func:`read_bandwidth` reads with."""
    return "a C loop" if _c_read() else "torch.sum"


@functools.cache
def _c_read():
    """bench/read_memory.c built with qkv's compiler and flags, as a function of a float32 tensor; None without."""
    cc = native.compiler()
    if cc is None:
        return None
    source = Path(__file__).with_name("read_memory.c")
    target = native.cache_dir() / f"read_memory-{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}.so"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        built = subprocess.run([cc, *native.FLAGS, "-o", str(target), str(source)], capture_output=True, timeout=120)
        if built.returncode != 0:
            return None
    lib = ctypes.CDLL(str(target))
    lib.qkv_bench_read.restype = ctypes.c_double
    lib.qkv_bench_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32]
    return lambda x: lib.qkv_bench_read(x.data_ptr(), x.numel(), torch.get_num_threads())


def weight_bytes(model: torch.nn.Module) -> int:
    """The bytes of the model's parameters, each counted once (a tied W_U is the embedding): what a decode step
    reads of its weights."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def export(bundle, out: str, kind: str) -> None:
    from qkv.export.gguf import export_gguf

    export_gguf(bundle.model, bundle.tokenizer, out, gguf_type=kind, chat_template=bundle.chat_template)


def main(threads: int, q4_1: str, q4_0: str, step: str) -> None:
    torch.set_num_threads(threads)
    widths = Widths(q4_1, q4_0)
    print(json.dumps({"ready": torch.__version__}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "export":
            export(widths.fp32(), request["file"], request["type"])
            answer: dict = {"ok": True}
        elif op == "encode":
            answer = {"ids": widths.fp32().tokenizer.encode(request["text"])}
        elif op == "decode":
            answer = decode(widths[request["width"]], request["prompts"], request["new"], step)
        elif op == "bandwidth":
            answer = {**read_bandwidth(sustained_bytes=request.get("bytes", 0)), "kind": read_kind()}
        elif op == "weights":
            answer = {"bytes": weight_bytes(widths["fp32"])}
        elif op == "prefill":
            answer = prefill(widths[request["width"]], request["ids"], step)
        else:
            answer = score(widths[request["width"]], request["windows"], step)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
