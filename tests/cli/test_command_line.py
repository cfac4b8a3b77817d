"""The command line people expect: options anywhere, --device/--threads on every verb that runs a model."""

from __future__ import annotations

import argparse

import pytest
import torch

from qkv.cli import VERBS, build_parser, parse, verb_parsers
from qkv.cli.common import use_device


def test_options_anywhere() -> None:
    parser = build_parser()
    args = parse(parser, ["translate", "RUN", "--beam", "1", "I am hungry.", "Where is the station?"])
    assert (args.run_dir, args.sentences, args.beam) == ("RUN", ["I am hungry.", "Where is the station?"], 1)
    args = parse(parser, ["embed", "--model", "M", "a cat", "--json", "a dog"])
    assert (args.model, args.run_dir, args.sentences, args.json) == ("M", "a cat", ["a dog"], True)
    args = parse(parser, ["generate", "--max-new-tokens", "5", "RUN", "--temperature", "0"])
    assert (args.run_dir, args.max_new_tokens, args.temperature) == ("RUN", 5, 0.0)


def test_every_verb_parses_intermixed() -> None:
    parser = build_parser()
    for verb in VERBS:
        with pytest.raises(SystemExit) as stop:
            parse(parser, [verb, "--help"])
        assert stop.value.code == 0


MODEL_VERBS = ("generate", "translate", "embed", "eval", "explain", "attention", "next", "embeddings", "lens")
MODEL_VERBS += ("attribute", "patch", "heads", "serve")


@pytest.mark.parametrize("verb", MODEL_VERBS)
def test_device_auto_and_threads_on_every_model_verb(verb) -> None:
    options = {o: a for a in verb_parsers()[verb]._actions for o in a.option_strings}
    assert options["--device"].default == "auto"
    assert "--threads" in options


@pytest.mark.parametrize("verb", ["quantize", "export"])
def test_threads_on_the_writers(verb) -> None:
    assert "--threads" in {o for a in verb_parsers()[verb]._actions for o in a.option_strings}


def test_use_device_resolves_auto_and_sets_threads() -> None:
    before = torch.get_num_threads()
    try:
        device = use_device(argparse.Namespace(device="auto", threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert device == ("cuda:0" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu")


def test_word_level_generate_prints_what_the_tokenizer_decodes(tmp_path, capsys) -> None:
    from qkv.cli import main
    from qkv.decoding import stream
    from qkv.model_dir import load_model_dir
    from tests.cli.test_bad_input import GOOD_TEXT, train_args

    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    run = tmp_path / "run"
    assert main(train_args(data, run, "--tokenizer", "word", "--context-length", "16")) == 0
    capsys.readouterr()
    prompt = "this is a small"
    assert main(["generate", str(run), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "6"]) == 0
    printed = capsys.readouterr().out.removesuffix("\n")
    bundle = load_model_dir(run)
    ids = bundle.tokenizer.encode(prompt)
    new = list(stream(bundle.model, ids, max_new_tokens=6, temperature=0.0, eos_id=bundle.tokenizer.eos_id))
    assert printed == bundle.tokenizer.decode(ids + new)
    assert printed.startswith(prompt + " ")  # the first new word is not glued to the prompt


def test_explain_fits_80_columns(tiny_run, capsys, monkeypatch) -> None:
    import re

    from qkv.cli import main

    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["explain", "hello world, this is a small corpus", "--run", str(tiny_run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not [line for line in lines if re.search(r"\d…", line)]  # no number cut short ("0.05…")
    assert "COLUMNS=160" in " ".join(lines[-3:])  # how to widen


def test_a_translator_prints_sample_translations_and_the_next_commands(tmp_path, capsys) -> None:
    from qkv.cli import main
    from tests.training.tasks.test_translation import write_pairs

    data, run = tmp_path / "pairs.tsv", tmp_path / "run"
    write_pairs(data)
    args = ["train", "--task", "translate", "--data", str(data), "--out-dir", str(run), "--steps", "4"]
    args += ["--warmup-steps", "1", "--eval-interval", "4", "--bleu-sentences", "2", "--d-model", "32"]
    args += ["--n-heads", "2", "--d-ff", "64", "--max-len", "48"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "sample translations of validation sentences" in captured.out
    assert captured.out.count("reference: ") == 8
    assert f'qkv translate {run} "a sentence to translate"' in captured.err


def test_embed_and_embeddings_say_how_they_differ() -> None:
    listing = " ".join(build_parser().format_help().split())
    assert "compare them by cosine (for the rows of W_E: qkv embeddings)" in listing
    assert "the positional table (sentences: qkv embed)" in listing


def test_the_next_verb_lives_in_a_module_that_does_not_shadow_next() -> None:
    import importlib.util

    assert importlib.util.find_spec("qkv.cli.next") is None
    assert "next" in build_parser().format_help()
