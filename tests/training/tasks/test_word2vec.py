"""Word2Vec through the trainer: planted neighbours and a planted analogy are learned by skip-gram and
CBOW; the loss decreases; a resumed run ends with the same weights as an uninterrupted one; a folder
written by ``qkv prepare --tokenizer word`` trains like its text, and other prepared folders are refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qkv.data.prepare import prepare
from qkv.errors import QkvError
from qkv.inspect.embeddings import analogy, nearest_neighbours
from qkv.model_dir import load_model_dir
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.config import TrainConfig
from qkv.training.tasks.word2vec import train_word2vec

GENDER = {"male": ["he", "his", "him"], "female": ["she", "her", "hers"]}
RANK = {
    "royal": ["crown", "throne", "palace"],
    "common": ["street", "market", "work"],
    "young": ["school", "toy", "play"],
}
WORDS = {
    ("male", "royal"): "king",
    ("female", "royal"): "queen",
    ("male", "common"): "man",
    ("female", "common"): "woman",
    ("male", "young"): "boy",
    ("female", "young"): "girl",
}
FILLERS = [f"f{i}" for i in range(30)]


def planted_corpus(path: Path, sentences: int = 600, seed: int = 0) -> Path:
    """Each line: one of six words, two words of its gender, two of its rank and three fillers, shuffled.
    So king - man + woman lands on queen, and crown, throne, palace share their contexts."""
    rng = np.random.default_rng(seed)
    keys = list(WORDS)
    lines = []
    for _ in range(sentences):
        gender, rank = keys[rng.integers(len(keys))]
        words = [WORDS[gender, rank], *rng.choice(GENDER[gender], 2), *rng.choice(RANK[rank], 2)]
        words += list(rng.choice(FILLERS, 3))
        lines.append(" ".join(rng.permutation(words)))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def config(data: Path, out: Path, **changes) -> TrainConfig:
    settings = dict(
        task="word2vec",
        data=str(data),
        out_dir=str(out),
        min_count=1,
        sample=0.0,
        window=4,
        batch_size=400,
        epochs=6,
        eval_interval=30,
        eval_batches=4,
        log_interval=10,
        model={"d_model": 16},
    )
    return TrainConfig.create(**{**settings, **changes})


@pytest.mark.parametrize("arch", ["skipgram", "cbow"])
def test_learns_planted_neighbours_and_analogy(tmp_path: Path, arch: str) -> None:
    data = planted_corpus(tmp_path / "planted.txt")
    # seed 1: with CBOW the analogy was top-1 in 18 of the 19 seeds tried (0-5, 100-109, 7, 42; not 1337)
    result = train_word2vec(config(data, tmp_path / "run", arch=arch, seed=1), quiet=True)
    assert result.stopped == "finished"
    bundle = load_model_dir(result.run_dir)
    table = bundle.model.token_embedding.weight.detach().double().numpy()
    tok = bundle.tokenizer
    ids = {w: tok.token_to_id(w) for w in [*WORDS.values(), *RANK["royal"], *RANK["young"]]}
    crown = [i for i, _ in nearest_neighbours(table, table[ids["crown"]], k=2, exclude={ids["crown"]})]
    assert set(crown) == {ids["throne"], ids["palace"]}
    school = [i for i, _ in nearest_neighbours(table, table[ids["school"]], k=2, exclude={ids["school"]})]
    assert set(school) == {ids["toy"], ids["play"]}
    assert analogy(table, ids["king"], ids["man"], ids["woman"])[0][0] == ids["queen"]
    assert analogy(table, ids["boy"], ids["man"], ids["woman"])[0][0] == ids["girl"]
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in rows if "train_loss" in r]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert losses[-1] < 0.8 * losses[0] and evals[-1] < evals[0]


@pytest.mark.parametrize("source", ["text", "prepared"])
def test_resume_continues_exactly(tmp_path: Path, source: str) -> None:
    data = planted_corpus(tmp_path / "planted.txt", sentences=200)
    if source == "prepared":
        data = prepare(data, tmp_path / "prepared", tokenizer="word", quiet=True).folder
    # bit for bit: on the CPU (a GPU's parallel sums have no fixed order)
    settings = dict(epochs=None, steps=10, eval_interval=4, batch_size=200, device="cpu")
    whole = train_word2vec(config(data, tmp_path / "whole", **settings), quiet=True)

    def stop_at_6(trainer, step: int, loss: float) -> None:
        if step == 6:
            trainer.request_stop()  # what Ctrl-C does: a checkpoint at step 6

    part = train_word2vec(config(data, tmp_path / "part", **settings), quiet=True, on_step=stop_at_6)
    assert part.stopped == "interrupted" and part.step == 6
    resumed = train_word2vec(config(data, tmp_path / "part", **settings), resume=tmp_path / "part", quiet=True)
    assert resumed.step == whole.step == 10
    a = load_model_dir(whole.run_dir, weights_path=latest_checkpoint(whole.run_dir) / "model.safetensors").model
    b = load_model_dir(resumed.run_dir, weights_path=latest_checkpoint(resumed.run_dir) / "model.safetensors").model
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_epochs_set_the_steps(tmp_path: Path) -> None:
    data = planted_corpus(tmp_path / "planted.txt", sentences=100)  # 800 words: 2 batches of 400 per pass
    result = train_word2vec(config(data, tmp_path / "run", epochs=3, eval_interval=100), quiet=True)
    assert result.step == 6
    saved = json.loads((result.run_dir / "train_config.json").read_text())["train"]
    assert saved["steps"] == 6 and saved["epochs"] == 3
    assert TrainConfig.create(task="word2vec", steps=7).epochs is None  # an explicit --steps wins


def test_trains_on_a_prepared_word_folder(tmp_path: Path) -> None:
    text = planted_corpus(tmp_path / "planted.txt")
    folder = prepare(text, tmp_path / "prepared", tokenizer="word", quiet=True).folder
    from_text = load_model_dir(
        train_word2vec(config(text, tmp_path / "text", steps=1, epochs=None), quiet=True).run_dir
    )
    result = train_word2vec(config(folder, tmp_path / "run", min_count=2), quiet=True)
    bundle = load_model_dir(result.run_dir)
    assert bundle.tokenizer == from_text.tokenizer  # the same words, in the same order, as from the text
    assert json.loads((result.run_dir / "train_config.json").read_text())["data"]["prepared"] == str(folder)
    table = bundle.model.token_embedding.weight.detach().double().numpy()
    ids = {w: bundle.tokenizer.token_to_id(w) for w in ["crown", "throne", "palace", "king", "man", "woman", "queen"]}
    crown = [i for i, _ in nearest_neighbours(table, table[ids["crown"]], k=2, exclude={ids["crown"]})]
    assert set(crown) == {ids["throne"], ids["palace"]}
    assert analogy(table, ids["king"], ids["man"], ids["woman"])[0][0] == ids["queen"]


def test_a_prepared_folder_needs_words(tmp_path: Path) -> None:
    text = planted_corpus(tmp_path / "planted.txt", sentences=50)
    chars = prepare(text, tmp_path / "chars", tokenizer="char", quiet=True).folder
    with pytest.raises(QkvError, match="--tokenizer word"):
        train_word2vec(config(chars, tmp_path / "run"), quiet=True)
    words = prepare(text, tmp_path / "words", tokenizer="word", quiet=True).folder
    with pytest.raises(QkvError, match="min-count=1000"):
        train_word2vec(config(words, tmp_path / "run", min_count=1000), quiet=True)


@pytest.mark.parametrize("arch", ["skipgram", "cbow"])
def test_written_out_step_trains_like_autograd_and_sgd(tmp_path: Path, arch: str, monkeypatch) -> None:
    """The trainer uses the task's own step (Word2Vec.sgd_step); with it taken away it falls back to
    loss.backward() and the SGD optimizer. Both runs end with the same weights."""
    from qkv.training.tasks.word2vec import Word2VecTask

    data = planted_corpus(tmp_path / "planted.txt", sentences=200)
    fused = train_word2vec(config(data, tmp_path / "fused", arch=arch, epochs=2), quiet=True)
    monkeypatch.setattr(Word2VecTask, "update", None)
    reference = train_word2vec(config(data, tmp_path / "reference", arch=arch, epochs=2), quiet=True)
    ours, theirs = load_model_dir(fused.run_dir).model, load_model_dir(reference.run_dir).model
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert ours.output_embedding.weight.abs().max() > 0.01  # trained
