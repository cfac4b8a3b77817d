"""Translation training: the same trainer as language models (exact resume, best model by the metric)."""

from __future__ import annotations

import torch
from safetensors.torch import load_file

from qkv.training import TrainConfig, train_translator
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.metrics import read_metrics

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def write_pairs(path) -> None:
    """A toy 'language': the target is the source with its words in reverse order, upper-cased."""
    lines = []
    for i in range(300):
        words = [WORDS[(i * 7 + j * 3) % 10] for j in range(2 + i % 3)]
        lines.append(" ".join(words) + "\t" + " ".join(reversed(words)).upper())
    path.write_text("\n".join(lines) + "\n")


def tiny(tmp_path, name: str, **kw) -> TrainConfig:
    data = tmp_path / "pairs.tsv"
    write_pairs(data)
    settings = dict(
        task="translate",
        data=str(data),
        out_dir=str(tmp_path / name),
        steps=12,
        batch_size=16,
        warmup_steps=2,
        eval_interval=4,
        eval_batches=2,
        bleu_sentences=8,
        log_interval=1,
        model={"d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1, "dropout": 0.1},
    )
    settings.update(kw)
    return TrainConfig.create(**settings)


def test_translation_resume_is_exact_and_the_metric_is_bleu(tmp_path) -> None:
    # bit for bit: on the CPU (a GPU's parallel sums have no fixed order)
    whole = train_translator(tiny(tmp_path, "whole", device="cpu"), quiet=True)
    assert whole.stopped == "finished"
    evals = [r for r in read_metrics(whole.run_dir) if "bleu" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    assert whole.best == max(r["bleu"] for r in evals)
    assert all(0 <= r["exact_match"] <= 1 and r["chrf"] >= 0 for r in evals)

    def stop(trainer, step, loss) -> None:
        if step == 6:
            trainer.request_stop()

    config = tiny(tmp_path, "split", device="cpu")
    assert train_translator(config, quiet=True, on_step=stop).stopped == "interrupted"
    assert train_translator(config, resume=config.out_dir, quiet=True).step == 12
    losses = lambda run: {r["step"]: r["train_loss"] for r in read_metrics(run) if "train_loss" in r}  # noqa: E731
    assert losses(config.out_dir) == losses(whole.run_dir)
    a = load_file(str(latest_checkpoint(whole.run_dir) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(config.out_dir) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_separate_vocabularies_write_two_tokenizers(tmp_path) -> None:
    result = train_translator(tiny(tmp_path, "sep", shared_vocab=False, steps=4), quiet=True)
    assert (result.run_dir / "tokenizer.json").exists() and (result.run_dir / "tokenizer_target.json").exists()


def test_rnnsearch_trains_with_the_same_trainer_and_resumes_exactly(tmp_path) -> None:
    model = {"d_embedding": 16, "d_hidden": 16, "d_attention": 8, "d_readout": 16, "dropout": 0.1}
    whole = train_translator(tiny(tmp_path, "rnn-whole", arch="rnnsearch", model=model, steps=8), quiet=True)
    assert whole.stopped == "finished" and (whole.run_dir / "model.safetensors").exists()

    def stop(trainer, step, loss) -> None:
        if step == 4:
            trainer.request_stop()

    config = tiny(tmp_path, "rnn-split", arch="rnnsearch", model=model, steps=8)
    assert train_translator(config, quiet=True, on_step=stop).stopped == "interrupted"
    assert train_translator(config, resume=config.out_dir, quiet=True).step == 8
    a = load_file(str(latest_checkpoint(whole.run_dir) / "model.safetensors"))
    b = load_file(str(latest_checkpoint(config.out_dir) / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_papers_schedule_scales_by_each_familys_width(tmp_path) -> None:
    """noam: lr = scale d^-0.5 min(n^-0.5, n warmup^-1.5), d the family's width (RNNSearch: its GRU state)."""
    from qkv.training.schedule import noam

    rnn = {"d_embedding": 16, "d_hidden": 12, "d_attention": 8, "d_readout": 16}
    for name, arch, model, width in (("t", "transformer", {}, 32), ("r", "rnnsearch", rnn, 12)):
        extra = {"model": model} if model else {}
        config = tiny(tmp_path, name, arch=arch, schedule="noam", lr=1.0, steps=3, eval_interval=3, **extra)
        run = train_translator(config, quiet=True).run_dir
        rates = [r["lr"] for r in read_metrics(run) if "lr" in r]
        assert rates and rates == [noam(s, d_model=width, warmup=2) for s in range(len(rates))]
