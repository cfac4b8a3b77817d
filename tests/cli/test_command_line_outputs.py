"""What the verbs print and write, through the real entry point: pictures go to the run folder (or --out),
never over a file in the current folder; notes name what they are about and print once under torchrun;
the training summary names its metric; eval tells a translator's user about --src/--ref."""

from __future__ import annotations

import pytest
import torch

from qkv.cli import main
from qkv.cli.train_report import best_score
from tests.cli.conftest import gpt_and_translator
from tests.cli.test_bad_input import GOOD_TEXT, assert_one_line_error, run_cli, train_args


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return gpt_and_translator(tmp_path_factory.mktemp("outputs"), gpt_context=64)


# (argv without the model, the picture's name): with RUN_DIR and no --out, the picture goes into the run folder
PICTURES = [
    (["attention", "the fox"], "attention.png"),
    (["lens", "the fox"], "lens.png"),
    (["attribute", "the fox"], "attribution.png"),
    (["patch", "--clean", "the fox", "--corrupt", "the fix", "--token", "o", "--foil", "e"], "patch.png"),
    (["heads", "--length", "8", "--batch", "2"], "heads.png"),
    (["next", "the fox"], "next-token.png"),
    (["embeddings"], "embeddings.png"),
]


@pytest.mark.parametrize(("argv", "name"), PICTURES, ids=[a[0] for a, _ in PICTURES])
def test_pictures_go_to_the_run_folder_not_the_current_one(models, tmp_path, monkeypatch, capsys, argv, name) -> None:
    gpt, _ = models
    monkeypatch.chdir(tmp_path)
    (tmp_path / name).write_bytes(b"the user's own file")
    assert main([argv[0], str(gpt), *argv[1:]]) == 0
    assert f"wrote {gpt / name}" in capsys.readouterr().out
    assert (gpt / name).stat().st_size > 1000
    assert (tmp_path / name).read_bytes() == b"the user's own file"
    # a pretrained model named with --model has no run folder: ./NAME, but never over a file there
    code, err = run_cli(capsys, argv[0], "--model", str(gpt), *argv[1:])
    assert_one_line_error(code, err, f"{name} already exists in this folder: give --out FILE")
    assert (tmp_path / name).read_bytes() == b"the user's own file"
    out = tmp_path / "chosen.png"
    assert main([argv[0], "--model", str(gpt), *argv[1:], "--out", str(out)]) == 0 and out.stat().st_size > 1000


def test_html_defaults_beside_the_picture_in_lens_and_attention(models, tmp_path, capsys) -> None:
    gpt, _ = models
    assert main(["lens", str(gpt), "the fox", "--html"]) == 0
    assert (gpt / "lens.html").is_file()
    assert main(["attention", str(gpt), "the fox", "--out", str(tmp_path / "a.png"), "--html"]) == 0
    assert (tmp_path / "a.html").is_file()


def test_lens_png_keeps_every_column_legible_on_a_long_text(models, tmp_path, capsys) -> None:
    from qkv.cli.lens import LEGIBLE_COLUMNS, legible_window
    from qkv.inspect.lens import logit_lens
    from qkv.loading import load

    gpt, _ = models
    text = ("the quick brown fox jumps over the lazy dog " * 2)[:60]  # 60 characters, 60 positions
    lens = logit_lens(load(gpt), text, top=2)
    shown, span = legible_window(lens, len(lens.tokens) - 1)
    assert len(shown.tokens) == LEGIBLE_COLUMNS < len(lens.tokens) and shown.final_probs.shape[1] == LEGIBLE_COLUMNS
    assert shown.tokens == lens.tokens[-LEGIBLE_COLUMNS:] and span == ", positions 20-59 of 60"
    assert [row[0] for row in shown.top_tokens[1]] == [row[0] for row in lens.top_tokens[1][20:]]
    assert legible_window(lens, 3)[0].tokens == lens.tokens[:LEGIBLE_COLUMNS]
    assert main(["lens", str(gpt), text, "--out", str(tmp_path / "l.png")]) == 0
    assert (tmp_path / "l.png").stat().st_size > 1000


def test_eval_of_a_translator_names_src_and_ref(models, tmp_path, capsys) -> None:
    _, translator = models
    hint = "is a translator: give a test set with --src SOURCES --ref REFERENCES"
    assert_one_line_error(*run_cli(capsys, "eval", str(translator)), hint)
    text = tmp_path / "text.txt"
    text.write_text("the fox\n")
    assert_one_line_error(*run_cli(capsys, "eval", str(translator), str(text)), "--src SOURCES --ref REFERENCES")


def test_the_unk_note_names_the_unknown_pieces(models, capsys) -> None:
    gpt, _ = models
    assert main(["next", str(gpt), "the Ωfox§", "--no-plot"]) == 0
    err = capsys.readouterr().err
    assert "2 of 9 tokens of the text became <unk> ('Ω', '§')" in err


def _train(tmp_path, *extra: str) -> list[str]:
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    argv = train_args(data, tmp_path / "run", "--steps", "2", "--eval-interval", "1", *extra)
    return [a for a in argv if a != "--quiet"]


def test_the_summary_names_its_metric(tmp_path, capsys) -> None:
    assert main(_train(tmp_path)) == 0
    err = capsys.readouterr().err
    assert "note: warmup" not in err  # --warmup-steps is given
    assert "finished at step 2; best validation loss " in err


@pytest.mark.parametrize(
    ("metric", "best", "text"),
    [("val_loss", 1.23456, ("validation loss", "1.2346")), ("bleu", 27.346, ("validation BLEU", "27.35")),
     ("exact_match", 0.875, ("validation exact match", "87.5%")), ("eval_loss", None, ("evaluation loss", "-"))],
)  # fmt: skip
def test_every_metric_has_a_name(metric, best, text) -> None:
    assert best_score(metric, best) == text


def test_notes_and_summary_print_once_under_torchrun(tmp_path, monkeypatch, capsys) -> None:
    """Ranks 1 and up stay quiet: the warmup note, the summary and the next commands come from rank 0 only."""
    argv = _train(tmp_path)
    at = argv.index("--warmup-steps")
    del argv[at : at + 2]  # the default warmup, shortened to fit 2 steps: the note has something to say
    monkeypatch.setenv("RANK", "1")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note:" not in err and "best validation loss" not in err and "next:" not in err


def test_train_says_torch_compile_is_at_work(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # the note, not the minute of compiling
    assert main(_train(tmp_path, "--compile", "on")) == 0
    err = capsys.readouterr().err
    assert "note: compiling the model with torch.compile: the first step takes about a minute" in err


def test_generate_says_torch_compile_is_at_work(models, monkeypatch, capsys) -> None:
    import qkv.decoding

    gpt, _ = models

    class Nothing(list):
        cropped = 0

    monkeypatch.setattr(qkv.decoding, "stream", lambda *a, **kw: Nothing())  # no minute of compiling here
    assert main(["generate", str(gpt), "--engine", "compiled", "--max-new-tokens", "1"]) == 0
    err = capsys.readouterr().err
    assert "note: compiling the decode step with torch.compile: about a minute the first time" in err
    assert main(["generate", str(gpt), "--engine", "static", "--max-new-tokens", "1"]) == 0
    assert "compiling" not in capsys.readouterr().err


def test_generate_says_how_long_compiling_took(models, monkeypatch, capsys) -> None:
    from qkv.decoding import fast_step

    gpt, translator = models
    monkeypatch.setattr(fast_step, "COMPILE_BACKEND", "aot_eager")  # seconds, not a minute of Inductor
    for command in (
        ["generate", str(gpt), "--max-new-tokens", "3", "--prompt", "ab"],
        ["translate", str(translator), "ab"],
    ):
        assert main([*command, "--step", "compiled"]) == 0
        said = [line for line in capsys.readouterr().err.splitlines() if "compiling the decode step took" in line]
        assert len(said) == 1, command
        seconds = float(said[0].split("took ")[1].split(" s")[0])
        assert seconds > 0 and "Inductor keeps what it compiled in" in said[0]
