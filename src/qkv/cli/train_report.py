"""What ``qkv train`` prints when a run is done: the score that chose the best model, samples at two
temperatures (so the effect of T on softmax(z / T) is visible), translations with their references, a word's
nearest neighbours by cosine, and the commands to run next with the run's real path.
"""

from __future__ import annotations

import sys

from qkv.cli.options import note
from qkv.training.config import TrainConfig


def next_commands(task: str, run_dir, stopped: str, *, lora: bool = False) -> str:
    """What to run next with the run just trained (its real path in every command)."""
    use = {
        "translate": f'qkv translate {run_dir} "a sentence to translate"',
        "word2vec": f"qkv embeddings {run_dir} --neighbours WORD",
    }.get(task, f'qkv generate {run_dir} --prompt "Once upon a time"')
    lines = ["next:", f"  {use}", f"  qkv plot {run_dir}            # the loss curve"]
    if lora:
        lines.append(f"  qkv merge {run_dir} --out {run_dir}-merged   # the adapters folded into the base")
    if stopped in ("interrupted", "time limit"):
        lines.append(f"  qkv train --resume {run_dir}   # continue where it stopped")
    return "\n".join(lines)


METRIC_NAMES = {
    "val_loss": ("validation loss", "{:.4f}"),
    "train_eval_loss": ("loss on training batches (no validation split)", "{:.4f}"),
    "eval_loss": ("evaluation loss", "{:.4f}"),
    "bleu": ("validation BLEU", "{:.2f}"),
    "exact_match": ("validation exact match", "{:.1%}"),
}


def best_score(metric: str, best: float | None) -> tuple[str, str]:
    """The summary's name for the metric that chose the best model, and its best value as text."""
    name, form = METRIC_NAMES.get(metric, (metric.replace("_", " ") or "score", "{:.4f}"))
    return name, form.format(best) if best is not None else "-"


def print_samples(run_dir, *, length: int, temperatures: tuple[float, ...] = (0.6, 1.0)) -> None:
    """Generate from the trained model at two temperatures, so the effect of T is visible."""
    import torch

    from qkv.decoding import TextStreamer, stream
    from qkv.loading import load

    bundle = load(run_dir)  # a LoRA run: its base with the adapters
    tokenizer = bundle.tokenizer
    prompt = tokenizer.encode("\n") or [t for t in (tokenizer.bos_id,) if t is not None]
    for temperature in temperatures:
        print(f"\n--- sample at temperature {temperature} ---", flush=True)
        streamer = TextStreamer(tokenizer)
        generator = torch.Generator().manual_seed(0)
        for token in stream(bundle.model, prompt, max_new_tokens=length, temperature=temperature, generator=generator):
            sys.stdout.write(streamer.push(token))
            sys.stdout.flush()
        sys.stdout.write(streamer.flush() + "\n")


def print_translations(run_dir, config: TrainConfig, *, count: int = 8) -> None:
    """Translate a few examples the model has never seen: fresh dates for the built-in task, else the first
    validation pairs (greedy), each with its reference."""
    from qkv.data.dates import held_out_pairs
    from qkv.decoding.translator import Translator

    translator = Translator.load(run_dir)
    if config.data not in (None, "dates"):
        from qkv.training.tasks.translation import load_translation_data

        _, val, _ = load_translation_data(config)
        sources, targets = val.sources[:count], val.targets[:count]
        print("\nsample translations of validation sentences (greedy; qkv translate for beam search):")
        for source, output, target in zip(sources, translator.translate(sources, beam=1), targets, strict=True):
            print(f"  {source}\n    -> {output}\n    reference: {target}")
        return
    fresh = held_out_pairs(1000, seed=987_654)
    outputs = translator.translate(fresh.sources, beam=1)
    correct = sum(o == t for o, t in zip(outputs, fresh.targets, strict=True))
    print(f"\nexact match on {len(fresh)} freshly generated dates: {100 * correct / len(fresh):.1f}%")
    for source, output, target in list(zip(fresh.sources, outputs, fresh.targets, strict=True))[:count]:
        print(f"  {source:<40} -> {output}  {'ok' if output == target else 'expected ' + target}")


def print_neighbours(run_dir, *, words: int = 5, k: int = 5) -> None:
    """The nearest words to a few frequent ones: what the word vectors learned, at a glance."""
    from qkv.inspect.embeddings import alike_note, neighbours_of, tokens_to_plot
    from qkv.model_dir import load_model_dir

    bundle = load_model_dir(run_dir)
    tokenizer = bundle.tokenizer
    print("\nnearest words by cosine similarity (qkv embeddings RUN_DIR --neighbours WORD for more):")
    lists = []
    for i in tokens_to_plot(tokenizer, top=words * 4)[words * 3 :]:  # frequent, but past "the", ",", "."
        word = tokenizer.id_to_token(i)
        lists.append(neighbours_of(bundle, word, k=k))
        print(f"  {word}: {', '.join(f'{w} {s:.2f}' for w, s in lists[-1])}")
    alike = alike_note(lists)
    if alike:
        note(alike)
