"""`qkv train --task word2vec` and `qkv embeddings` on its run, as a user types them; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkv.cli import main
from tests.cli.test_bad_input import refused
from tests.training.tasks.test_word2vec import planted_corpus

QUESTIONS = """: royal-common
king man queen woman
queen woman king man
: young
boy man girl woman
man boy woman girl
king man nobody woman
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("w2v")
    data = planted_corpus(folder / "planted.txt")
    out = folder / "run"
    argv = ["train", "--task", "word2vec", "--data", str(data), "--out-dir", str(out), "--min-count", "1"]
    argv += ["--sample", "0", "--window", "4", "--dim", "16", "--batch-size", "400", "--epochs", "6", "--quiet"]
    assert main([*argv, "--eval-interval", "30", "--no-samples"]) == 0
    return out


def test_embeddings_reads_a_word2vec_run_like_any_w_e(capsys, run: Path, tmp_path: Path, monkeypatch) -> None:
    assert main(["embeddings", str(run), "--neighbours", "crown", "--analogy", "king", "man", "woman", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {w for w, _ in out["neighbours"]["crown"][:2]} == {"throne", "palace"}
    assert out["analogy"]["answers"][0][0] == "queen"
    monkeypatch.chdir(tmp_path)
    assert main(["embeddings", str(run), "--first", "30"]) == 0
    assert (run / "embeddings.png").stat().st_size > 1000  # into the run folder, not the current one
    assert not (run / "positions.png").exists() and not list(tmp_path.glob("*.png"))  # Word2Vec has no positions


def test_analogies_file_gives_accuracy_per_section(capsys, run: Path, tmp_path: Path) -> None:
    questions = tmp_path / "questions.txt"
    questions.write_text(QUESTIONS)
    assert main(["embeddings", str(run), "--analogies", str(questions), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["analogies"]
    assert [s["section"] for s in result["sections"]] == ["royal-common", "young"]
    assert [s["answered"] for s in result["sections"]] == [2, 2]
    assert result["sections"][1]["skipped"] == 1  # "nobody" is not in the vocabulary
    assert result["total"]["accuracy"] == 1.0
    assert main(["embeddings", str(run), "--analogies", str(questions)]) == 0
    table = capsys.readouterr().out
    assert "royal-common" in table and "100.0%" in table


def test_bad_input_is_one_line(capsys, run: Path, tmp_path: Path) -> None:
    small = tmp_path / "small.txt"
    small.write_text("the cat sat on the mat\n")
    train = ["train", "--task", "word2vec", "--out-dir", str(tmp_path / "bad"), "--quiet", "--no-samples"]
    refused(capsys, [*train, "--data", str(small)], "--min-count=5")
    refused(capsys, [*train, "--data", str(small), "--window", "0"], "--window must be a positive")
    refused(capsys, [*train, "--data", str(small), "--arch", "transformer"], "skipgram, cbow")
    refused(capsys, [*train, "--data", str(small), "--min-count", "1", "--n-layers", "2"], "drop --n-layers")
    refused(capsys, ["train", "--data", str(small), "--window", "3"], "are for --task word2vec")
    refused(capsys, ["embeddings", str(run), "--analogy", "king", "man", "zzz"], "'zzz' is not in this model")
    missing = tmp_path / "none.txt"
    missing.write_text(": s\nzzz yyy xxx www\n")
    refused(capsys, ["embeddings", str(run), "--analogies", str(missing)], "none of the 1 questions")
    refused(capsys, ["generate", str(run), "--prompt", "king"], "qkv embeddings")
    for argv in (["lens", str(run), "the king"], ["attribute", str(run), "the king"], ["heads", str(run)]):
        refused(capsys, argv, "`qkv embeddings`")
