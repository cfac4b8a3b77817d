"""`qkv train --arch llama` as a user types it: a few steps on the built-in corpus, text generated from the
run, the run resumed as the same family; --arch and --preset must agree."""

from __future__ import annotations

import json

import pytest

from qkv.cli import main
from tests.cli.test_bad_input import assert_one_line_error, run_cli

SMALL = ["--d-model", "32", "--n-heads", "4", "--n-kv-heads", "1", "--n-layers", "2", "--context-length", "32"]


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> object:
    run = tmp_path_factory.mktemp("llama") / "run"
    args = ["train", "--arch", "llama", *SMALL, "--rope-base", "500", "--steps", "6", "--batch-size", "4"]
    args += ["--warmup-steps", "1", "--eval-interval", "3", "--eval-batches", "1", "--out-dir", str(run), "--quiet"]
    assert main([*args, "--no-samples", "--threads", "1"]) == 0  # no --data: the built-in corpus
    return run


def test_the_run_is_a_llama_with_the_flags_sizes(llama_run) -> None:
    config = json.loads((llama_run / "config.json").read_text())
    assert config["model"] == "llama"  # the family resume and every other command rebuild
    assert (config["n_kv_heads"], config["n_heads"], config["rope_base"]) == (1, 4, 500.0)
    assert (config["norm"], config["feed_forward"], config["d_model"]) == ("rmsnorm", "glu", 32)


def test_the_run_generates_text_and_every_engine_gives_the_same_tokens(llama_run, capsys) -> None:
    import torch

    from qkv.cli.train_report import print_samples
    from qkv.decoding import generate
    from qkv.model_dir import load_model_dir

    print_samples(llama_run, length=20)  # what `qkv train` prints after training
    out = capsys.readouterr().out
    assert out.count("--- sample at temperature") == 2 and len(out) > 60
    bundle = load_model_dir(llama_run)
    assert type(bundle.model).__name__ == "Llama"
    prompt = torch.tensor([bundle.tokenizer.encode("The ")])
    tokens = [generate(bundle.model, prompt, max_new_tokens=20, temperature=0, step=e) for e in ("model", "static")]
    assert torch.equal(*tokens) and tokens[0].shape == (1, 24)


def test_resume_continues_the_llama(llama_run, capsys) -> None:
    from qkv.training.checkpoint import latest_checkpoint

    assert json.loads((latest_checkpoint(llama_run) / "trainer_state.json").read_text())["step"] == 6
    assert main(["train", "--resume", str(llama_run), "--steps", "9", "--quiet", "--no-samples"]) == 0
    assert json.loads((latest_checkpoint(llama_run) / "trainer_state.json").read_text())["step"] == 9
    assert json.loads((llama_run / "config.json").read_text())["model"] == "llama"


def test_an_arch_that_does_not_match_the_preset_is_one_line(tmp_path, capsys) -> None:
    code, err = run_cli(capsys, "train", "--arch", "llama", "--preset", "gpt-nano", "--steps", "2", "--quiet")
    assert_one_line_error(code, err, "--arch llama does not match --preset gpt-nano")
    code, err = run_cli(capsys, "train", "--arch", "bert", "--steps", "2", "--quiet")
    assert_one_line_error(code, err, "choose one of gpt, llama")
