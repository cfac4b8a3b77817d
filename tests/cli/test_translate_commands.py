"""`qkv translate` and `qkv eval --src --ref` as a user types them, and translation's bad-input messages."""

from __future__ import annotations

import io
import json

import pytest
import sacrebleu

from qkv.cli import main
from tests.cli.test_bad_input import refused
from tests.training.tasks.test_translation import write_pairs


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("translate")
    data = tmp / "pairs.tsv"
    write_pairs(data)
    run = tmp / "run"
    code = main(
        [
            "train",
            "--task",
            "translate",
            "--data",
            str(data),
            "--out-dir",
            str(run),
            "--steps",
            "40",
            "--batch-size",
            "16",
            "--warmup-steps",
            "4",
            "--eval-interval",
            "20",
            "--bleu-sentences",
            "8",
            "--d-model",
            "32",
            "--n-heads",
            "2",
            "--d-ff",
            "64",
            "--max-len",
            "48",
            "--quiet",
            "--no-samples",
        ]
    )
    assert code == 0
    return run, tmp


def test_translate_from_arguments_file_and_stdin_agree(translator, capsys, monkeypatch) -> None:
    run, tmp = translator
    sentences = ["one two three", "four five"]
    assert main(["translate", str(run), *sentences, "--beam", "1"]) == 0
    from_args = capsys.readouterr().out.splitlines()
    assert len(from_args) == 2
    source = tmp / "input.txt"
    source.write_text("\n".join(sentences) + "\n")
    assert main(["translate", str(run), "--file", str(source), "--beam", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == from_args
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(sentences) + "\n"))
    assert main(["translate", str(run), "--beam", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == from_args


def test_n_best_lists(translator, capsys) -> None:
    run, _ = translator
    assert main(["translate", str(run), "one two", "three four", "--beam", "3", "--n-best", "3"]) == 0
    groups = capsys.readouterr().out.strip().split("\n\n")
    assert len(groups) == 2
    for group in groups:
        rows = [line.split("\t") for line in group.splitlines()]
        assert [r[0] for r in rows] == ["1", "2", "3"]
        scores = [float(r[1]) for r in rows]
        assert scores == sorted(scores, reverse=True)


def test_the_engines_translate_alike(translator, capsys) -> None:
    run, _ = translator
    outputs = []
    for engine in ("model", "static"):
        assert (
            main(
                [
                    "translate",
                    str(run),
                    "one two",
                    "three four five",
                    "--beam",
                    "3",
                    "--n-best",
                    "2",
                    "--engine",
                    engine,
                ]
            )
            == 0
        )
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def test_eval_reports_sacrebleu_scores(translator, capsys) -> None:
    run, tmp = translator
    sources, references = ["one two three", "four five six seven"], ["THREE TWO ONE", "SEVEN SIX FIVE FOUR"]
    (tmp / "src.txt").write_text("\n".join(sources) + "\n")
    (tmp / "ref.txt").write_text("\n".join(references) + "\n")
    assert main(["translate", str(run), "--file", str(tmp / "src.txt"), "--beam", "2"]) == 0
    hypotheses = capsys.readouterr().out.splitlines()
    assert (
        main(["eval", str(run), "--src", str(tmp / "src.txt"), "--ref", str(tmp / "ref.txt"), "--beam", "2", "--json"])
        == 0
    )
    scores = json.loads(capsys.readouterr().out)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    assert scores["bleu_signature"].startswith("nrefs:1")


def test_bad_translation_input(translator, tmp_path, capsys) -> None:
    run, _ = translator
    (tmp_path / "a.en").write_text("one\ntwo\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\n")
    refused(
        capsys,
        [
            "train",
            "--task",
            "translate",
            "--data",
            f"{tmp_path / 'a.en'},{tmp_path / 'a.de'}",
            "--out-dir",
            str(tmp_path / "r1"),
            "--quiet",
        ],
        "a.en has 3 lines but a.de has 2",
    )
    (tmp_path / "bad.tsv").write_text("one\tONE\ntwo TWO\n")
    refused(
        capsys,
        [
            "train",
            "--task",
            "translate",
            "--data",
            str(tmp_path / "bad.tsv"),
            "--out-dir",
            str(tmp_path / "r2"),
            "--quiet",
        ],
        "line 2 of bad.tsv has no tab",
    )
    (tmp_path / "src.txt").write_text("one\ntwo\n")
    (tmp_path / "ref.txt").write_text("ONE\n")
    refused(
        capsys,
        ["eval", str(run), "--src", str(tmp_path / "src.txt"), "--ref", str(tmp_path / "ref.txt")],
        "has 2 lines but",
    )


def test_language_model_run_given_to_translate(tmp_path, capsys) -> None:
    data = tmp_path / "text.txt"
    data.write_text("some text for a language model to read. " * 50)
    assert (
        main(
            [
                "train",
                "--data",
                str(data),
                "--out-dir",
                str(tmp_path / "lm"),
                "--preset",
                "gpt-nano",
                "--steps",
                "2",
                "--warmup-steps",
                "1",
                "--eval-interval",
                "2",
                "--eval-batches",
                "1",
                "--quiet",
                "--no-samples",
            ]
        )
        == 0
    )
    expected = "holds a GPT language model (decoder only), not a translator: use `qkv generate`"
    refused(capsys, ["translate", str(tmp_path / "lm"), "hello"], expected)


def test_long_sources_are_cropped_with_a_warning(translator, capsys) -> None:
    run, _ = translator
    assert main(["translate", str(run), "one " * 40, "--beam", "1"]) == 0
    assert "cropped" in capsys.readouterr().err


def test_options_anywhere(translator, capsys) -> None:
    run, _ = translator
    assert main(["translate", str(run), "--beam", "1", "one two three", "four five"]) == 0
    intermixed = capsys.readouterr().out.splitlines()
    assert main(["translate", str(run), "one two three", "four five", "--beam", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == intermixed and len(intermixed) == 2


def test_unknown_characters_are_counted(translator, capsys) -> None:
    run, _ = translator
    assert main(["translate", str(run), "--beam", "1", "ΩΩ ΩΩ"]) == 0
    err = capsys.readouterr().err
    assert "became <unk>" in err and "Traceback" not in err
