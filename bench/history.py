"""Where attention came from, measured: RNNSearch (Bahdanau et al. 2015) and the Transformer trained with the
same budget on Multi30k German -> English, side by side.

Both go through one pipeline: the same shared BPE vocabulary (trained on the same training pairs with the
same settings, so the two runs' tokenizer.json files are identical, which is checked), the same batches
of about --max-tokens tokens, label smoothing 0.1, warmup + cosine, validation BLEU choosing the best
checkpoint; each model gets --minutes of wall-clock training, its step count set by a short speed probe
(the cosine schedule needs its length in advance). Then both translate test2016 with beam search and are
scored by sacrebleu. Printed side by side: BLEU, chrF, parameters, training target tokens/s, seconds per
epoch, decoding time; and one alignment picture each for the same test sentence (RNNSearch's additive
attention; the Transformer's last-layer cross-attention averaged over its heads).

The Transformer is bench/translate_multi30k.py's recipe (3+3 pre-LN layers, d_model 256, Muon + AdamW);
RNNSearch is rnnsearch-small with GRU states of 256 and AdamW (see docs/rnnsearch.md for why).

Published context (torchtext BLEU, on a GPU): a GRU with Bahdanau attention 28.1 BLEU and a small
Transformer 36.5 on this data, at 34 s vs 14 s per epoch.

    python bench/history.py --quick                          # end to end in a few minutes (tiny budgets)
    python bench/history.py --minutes 20 --parallel          # both at once, one core each
    python bench/history.py --minutes 30 --images docs/images  # one after the other, all cores each
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from settings_flag import add_set_argument, apply_settings
from translate_multi30k import DATA, bf16_is_native
from translate_multi30k import settings_for as transformer_settings

RNNSEARCH_MODEL = {"d_embedding": 256, "d_hidden": 256, "d_attention": 256, "d_readout": 256, "dropout": 0.2}
OWN_SETTINGS = (  # (arch, what replaces translate_multi30k's Transformer settings, torchtext BLEU and s per GPU epoch)
    ("rnnsearch", dict(arch="rnnsearch", preset="rnnsearch-small", optimizer="adamw", lr=2e-3), (28.1, 34)),
    ("transformer", {}, (36.5, 14)),
)
ARCHS = tuple(arch for arch, _, _ in OWN_SETTINGS)
PUBLISHED = {arch: published for arch, _, published in OWN_SETTINGS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=20.0, help="training budget per model (default 20)")
    parser.add_argument("--parallel", action="store_true", help="train both at once, one thread each")
    parser.add_argument("--quick", action="store_true", help="a tiny budget and 100 test sentences: runs in minutes")
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--out-dir", default=None, help="where the runs go (default: a new temporary folder)")
    parser.add_argument("--images", default=None, help="folder for the alignment PNGs (default: the --out-dir)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    parser.add_argument("--test-sentences", type=int, default=None, help="score only the first N of test2016")
    parser.add_argument("--sentence", type=int, default=0, help="the test2016 line drawn in the alignment pictures")
    parser.add_argument("--only", choices=ARCHS, help="train one model (used by --parallel for its workers)")
    parser.add_argument("--result", help="with --only: write its figures to this JSON file")
    add_set_argument(parser, "rnnsearch.lr=3e-3 or transformer.model.dropout=0.1 (prefix: which model)")
    args = parser.parse_args(argv)
    args.direction = "de-en"
    if args.quick:
        args.minutes = min(args.minutes, 1.0)
        args.test_sentences = args.test_sentences or 100
    return args


def settings_for(arch: str, args: argparse.Namespace, steps: int, out_dir: str) -> dict:
    """One model's training settings: translate_multi30k's for both, RNNSearch's model and optimizer on top."""
    own = [item.split(".", 1)[1] for item in args.set if item.startswith(arch + ".")]
    common = argparse.Namespace(**{**vars(args), "set": []})
    settings = transformer_settings(common, steps, out_dir)
    own_settings = next(own for name, own, _ in OWN_SETTINGS if name == arch)
    if own_settings:
        settings.update(own_settings)
        settings["model"] = dict(RNNSEARCH_MODEL, context_length=settings["model"]["context_length"])
    if args.quick:
        settings.update(eval_interval=max(steps, 1), bleu_sentences=50, eval_batches=5, log_interval=10)
    apply_settings(own, settings, settings["model"])
    return settings


def target_tokens_per_epoch(run_dir: Path, data: Path) -> int:
    """Target tokens (``<eos>`` included) in one pass over the training pairs, as the loss counts them."""
    from qkv.model_dir import load_model_dir

    bundle = load_model_dir(run_dir)
    tokenizer = bundle.target_tokenizer or bundle.tokenizer
    limit = bundle.config.context_length - 1
    lines = (data / "train.en").read_text(encoding="utf-8").splitlines()
    return sum(min(len(tokenizer.encode(line)), limit) + 1 for line in lines)


def alignment_picture(run_dir: Path, sentence: str, path: Path, arch: str) -> dict:
    """Draw the model's alignment while it translates ``sentence`` (its own greedy output)."""
    from qkv.inspect import attention_maps
    from qkv.inspect.attention_maps import AttentionGroup
    from qkv.inspect.figures import draw_attention
    from qkv.model_dir import load_model_dir

    maps = attention_maps(load_model_dir(run_dir), sentence)
    cross = maps.groups["cross"]
    weights = cross.weights[-1:].mean(axis=1, keepdims=True)  # (1, 1, Tq, Tk): last layer, mean over heads
    single = cross.n_layers == cross.n_heads == 1  # one alignment (RNNSearch's additive attention) or many heads
    title = f"{arch}: {cross.title}" + ("" if single else f", last layer, mean of {cross.n_heads} heads")
    group = AttentionGroup("cross", title, False, weights, cross.query_tokens, cross.key_tokens)
    panel = (
        "one weight per source token for each target token"
        if single
        else f"decoder layer {cross.n_layers - 1} (the last, numbered from 0), its {cross.n_heads} heads averaged"
    )
    picture = draw_attention(group, path, layer=0, head=0, title=title, panel_title=panel)
    peaks = np.argmax(weights[0, 0], axis=-1)
    return {"path": str(picture.path), "target": " ".join(maps.target_tokens or []), "peaks": peaks.tolist()}


def train_and_score(arch: str, args: argparse.Namespace, out_dir: Path) -> dict:
    """Probe, train for --minutes, translate test2016, draw the alignment; the figures as a dict."""
    from qkv.decoding.translator import Translator
    from qkv.training import TrainConfig, train_translator

    wall = time.perf_counter()
    step_seconds = {}
    with tempfile.TemporaryDirectory(prefix=f"qkv-history-probe-{arch}-") as probe_dir:
        for precision in ("fp32", "bf16") if bf16_is_native() else ("fp32",):
            probe_settings = settings_for(arch, args, 10 if args.quick else 20, str(Path(probe_dir) / precision))
            probe_settings.update(eval_interval=1000, warmup_steps=2, precision=precision, bleu_sentences=0)
            probe = train_translator(TrainConfig.create(**probe_settings), quiet=True)
            step_seconds[precision] = probe.train_seconds / probe.step
    precision = min(step_seconds, key=step_seconds.get)
    budget = args.minutes * 60 - (time.perf_counter() - wall)
    steps = max(20 if args.quick else 100, int(budget * 0.85 / step_seconds[precision]))  # ~15% for evaluations
    print(f"{arch}: probe {step_seconds[precision] * 1000:.0f} ms per step ({precision}) -> {steps} steps", flush=True)
    settings = settings_for(arch, args, steps, str(out_dir / arch))
    settings.setdefault("precision", precision)
    result = train_translator(TrainConfig.create(**settings), quiet=args.quick)
    train_minutes = (time.perf_counter() - wall) / 60

    data = Path(args.data)
    sources = (data / "test2016.de").read_text(encoding="utf-8").splitlines()
    references = (data / "test2016.en").read_text(encoding="utf-8").splitlines()
    picture_sentence = sources[args.sentence]
    if args.test_sentences:
        sources, references = sources[: args.test_sentences], references[: args.test_sentences]
    translator = Translator.load(result.run_dir)
    start = time.perf_counter()
    scores = translator.score(sources, references, beam=args.beam)
    decode_seconds = time.perf_counter() - start
    tokens_per_s = result.tokens / result.train_seconds
    epoch_tokens = target_tokens_per_epoch(result.run_dir, data)
    images = Path(args.images) if args.images else out_dir
    images.mkdir(parents=True, exist_ok=True)
    return {
        "arch": arch,
        "bleu": scores.bleu,
        "chrf": scores.chrf,
        "bleu_signature": scores.bleu_signature,
        "parameters": translator.model.num_parameters(),
        "steps": result.step,
        "train_minutes": train_minutes,
        "tokens_per_s": tokens_per_s,
        "seconds_per_epoch": epoch_tokens / tokens_per_s,
        "epochs": result.tokens / epoch_tokens,
        "decode_seconds": decode_seconds,
        "test_sentences": len(sources),
        "threads": torch.get_num_threads(),
        "run_dir": str(result.run_dir),
        "picture": alignment_picture(result.run_dir, picture_sentence, images / f"history-alignment-{arch}.png", arch),
    }


def run_parallel(args: argparse.Namespace, out_dir: Path) -> list[dict]:
    """Both models at once in two processes with one thread each (`--only ARCH --set threads=1`)."""
    workers = []
    for arch in ARCHS:
        result = out_dir / f"{arch}.json"
        command = [sys.executable, __file__, *sys.argv[1:], "--only", arch, "--result", str(result)]
        command += ["--out-dir", str(out_dir), "--set", f"{arch}.threads=1"]
        command = [c for c in command if c != "--parallel"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        workers.append((subprocess.Popen(command, env=env), result))
    for process, _ in workers:
        if process.wait() != 0:
            sys.exit(f"a worker failed (exit code {process.returncode})")
    return [json.loads(path.read_text()) for _, path in workers]


def report(figures: list[dict], args: argparse.Namespace) -> None:
    by = {f["arch"]: f for f in figures}
    rnn, tf = by["rnnsearch"], by["transformer"]
    same = Path(rnn["run_dir"], "tokenizer.json").read_bytes() == Path(tf["run_dir"], "tokenizer.json").read_bytes()
    print(f"\nMulti30k de-en, test2016 ({rnn['test_sentences']} sentences), beam {args.beam}, {args.minutes:g} "
          f"minutes per model ({'both at once, one thread each' if args.parallel else 'one after the other'}); "
          f"identical tokenizers: {same}")  # fmt: skip
    rows = [
        ("BLEU (sacrebleu)", "bleu", "{:.2f}"),
        ("chrF", "chrf", "{:.2f}"),
        ("parameters", "parameters", "{:,}"),
        ("training steps", "steps", "{:,}"),
        ("epochs", "epochs", "{:.2f}"),
        ("training target tokens/s", "tokens_per_s", "{:,.0f}"),
        ("seconds per epoch", "seconds_per_epoch", "{:,.0f}"),
        ("wall minutes (probe, training, evaluations)", "train_minutes", "{:.1f}"),
        ("decoding test2016 (s)", "decode_seconds", "{:.0f}"),
    ]
    print(f"  {'':<44} {'RNNSearch':>12} {'Transformer':>12}   ratio T/R")
    for label, key, fmt in rows:
        ratio = tf[key] / rnn[key] if rnn[key] else float("nan")
        print(f"  {label:<44} {fmt.format(rnn[key]):>12} {fmt.format(tf[key]):>12}   {ratio:.2f}")
    print(f"  published (torchtext BLEU, GPU): BLEU {PUBLISHED['rnnsearch'][0]} vs {PUBLISHED['transformer'][0]}, "
          f"{PUBLISHED['rnnsearch'][1]} s vs {PUBLISHED['transformer'][1]} s per epoch")  # fmt: skip
    print(f"  BLEU signature: {rnn['bleu_signature']}")
    for f in (rnn, tf):
        print(f"  {f['arch']}: alignment of test2016 line {args.sentence} -> {f['picture']['path']}")
        print(f"    target: {f['picture']['target']}")


def main() -> None:
    args = parse_args()
    if not Path(args.data).is_dir():
        sys.exit(f"{args.data} is absent: pass --data /path/to/multi30k")
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="qkv-history-"))
    if args.only:
        figures = train_and_score(args.only, args, out_dir)
        if args.result:
            Path(args.result).write_text(json.dumps(figures, indent=2) + "\n")
        return
    if any((out_dir / arch).exists() for arch in ARCHS):
        sys.exit(f"{out_dir} already holds runs: choose another --out-dir")
    start = time.perf_counter()
    figures = run_parallel(args, out_dir) if args.parallel else [train_and_score(a, args, out_dir) for a in ARCHS]
    (out_dir / "history.json").write_text(json.dumps(figures, indent=2) + "\n")
    report(figures, args)
    print(f"  total wall time {(time.perf_counter() - start) / 60:.1f} minutes; figures in {out_dir / 'history.json'}")


if __name__ == "__main__":
    main()
