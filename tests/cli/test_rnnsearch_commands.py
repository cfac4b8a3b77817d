"""RNNSearch through the commands a user types: `qkv train --arch rnnsearch`, then translate, eval and
attention on the run, exactly as on a Transformer's; and the bad --arch combinations, one line each."""

from __future__ import annotations

import json

import pytest
import sacrebleu

from qkv.cli import main
from qkv.decoding.translator import Translator
from qkv.training.run import RUN_CONFIG_FILE as RUN_CONFIG
from tests.training.tasks.test_translation import write_pairs

SMALL = ["--d-embedding", "24", "--d-hidden", "24", "--d-attention", "16", "--d-readout", "24", "--max-len", "48"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def rnnsearch_run(tmp_path_factory, one_thread):
    tmp = tmp_path_factory.mktemp("rnnsearch")
    data = tmp / "pairs.tsv"
    write_pairs(data)
    run = tmp / "run"
    args = ["train", "--task", "translate", "--arch", "rnnsearch", "--data", str(data), "--out-dir", str(run)]
    args += ["--steps", "30", "--batch-size", "16", "--warmup-steps", "4", "--eval-interval", "15"]
    assert main([*args, "--bleu-sentences", "8", *SMALL, "--quiet", "--no-samples"]) == 0
    return run, tmp


def test_the_run_holds_an_rnnsearch_trained_with_the_task_defaults(rnnsearch_run) -> None:
    run, _ = rnnsearch_run
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == "rnnsearch" and config["d_hidden"] == 24 and config["share_embeddings"]
    settings = json.loads((run / RUN_CONFIG).read_text())["train"]
    assert settings["arch"] == "rnnsearch" and settings["preset"] == "rnnsearch-small"
    assert settings["label_smoothing"] == 0.1  # the translation task's recipe


def test_translate_and_eval_work_on_an_rnnsearch_run(rnnsearch_run, capsys) -> None:
    run, tmp = rnnsearch_run
    sentences = ["one two three", "four five"]
    assert main(["translate", str(run), *sentences, "--beam", "1"]) == 0
    greedy = capsys.readouterr().out.splitlines()
    assert greedy == Translator.load(run).translate(sentences, beam=1)
    assert main(["translate", str(run), *sentences, "--beam", "3", "--n-best", "2"]) == 0
    groups = capsys.readouterr().out.strip().split("\n\n")
    assert len(groups) == 2 and all(len(group.splitlines()) == 2 for group in groups)
    src, ref = tmp / "src.txt", tmp / "ref.txt"
    src.write_text("\n".join(sentences) + "\n")
    ref.write_text("THREE TWO ONE\nFIVE FOUR\n")
    assert main(["eval", str(run), "--src", str(src), "--ref", str(ref), "--beam", "1", "--json"]) == 0
    scores = json.loads(capsys.readouterr().out)
    expected = sacrebleu.corpus_bleu(greedy, [["THREE TWO ONE", "FIVE FOUR"]]).score
    assert scores["bleu"] == pytest.approx(expected)


def test_attention_draws_the_alignment_as_cross_attention(rnnsearch_run, capsys) -> None:
    run, tmp = rnnsearch_run
    out = tmp / "align.png"
    assert main(["attention", str(run), "one two three", "--target", "THREE TWO ONE", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["groups"]) == ["cross"] and out.exists()
    cross = data["groups"]["cross"]
    weights = cross["weights"]  # (1 layer, 1 head, Tq, Tk)
    assert len(weights) == 1 and len(weights[0]) == 1
    rows = weights[0][0]
    assert len(rows) == len(cross["query_tokens"]) == len("THREE TWO ONE") + 1  # <bos> + target characters
    assert all(len(row) == len("one two three") and sum(row) == pytest.approx(1, abs=1e-4) for row in rows)
    assert main(["attention", str(run), "one two", "--part", "encoder", "--out", str(out)]) == 2
    assert "has no encoder attention" in capsys.readouterr().err
    assert main(["explain", "--run", str(run), "one two"]) == 2
    assert "qkv attention" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--arch", "rnnsearch", "--preset", "transformer-tiny"], "does not match --preset transformer-tiny"),
        (["--arch", "transformer", "--preset", "rnnsearch-small"], "does not match --preset rnnsearch-small"),
        (["--arch", "cbow"], "choose one of transformer, rnnsearch"),
        (["--arch", "rnnsearch", "--n-heads", "2"], "rnnsearch model has no n_heads"),
        (["--arch", "rnnsearch", "--d-readout", "100"], "must equal d_embedding"),
    ],
)
def test_bad_architecture_flags_are_one_line(tmp_path, capsys, flags, message) -> None:
    data = tmp_path / "pairs.tsv"
    write_pairs(data)
    code = main(["train", "--task", "translate", "--data", str(data), "--out-dir", str(tmp_path / "r"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("qkv train: error: ") and message in err.strip().splitlines()[-1]


def test_a_translators_arch_is_refused_for_a_language_model(capsys) -> None:
    assert main(["train", "--task", "lm", "--arch", "rnnsearch"]) == 2
    assert "is not an architecture of --task lm: choose one of gpt, llama" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["lens", "RUN", "one two"],
        ["attribute", "RUN", "one two"],
        ["patch", "RUN", "--clean", "one two", "--corrupt", "two one", "--target", "TWO"],
        ["heads", "RUN"],
    ],
)
def test_residual_stream_views_name_what_rnnsearch_has_instead(rnnsearch_run, capsys, argv) -> None:
    run, _ = rnnsearch_run
    assert main([str(run) if a == "RUN" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "RNNSearch" in err[0] and "qkv attention" in err[0] and "Traceback" not in err[0]
