"""Bad flag values, TOML settings, devices and sizes: one line naming the problem and the fix, exit code 2,
no traceback, and nothing allocated or written first."""

from __future__ import annotations

import json

import pytest
import torch

from tests.cli.test_bad_input import GOOD_TEXT, assert_one_line_error, run_cli, train_args

# (extra train flags, a fragment of the one line they get)
TRAIN_FLAGS = [
    (["--beta1", "2"], "--beta1 must be in [0, 1)"),
    (["--beta2", "-0.5"], "--beta2 must be in [0, 1)"),
    (["--muon-lr", "-1"], "--muon-lr must be above 0"),
    (["--early-stop", "-3"], "--early-stop must be 0"),
    (["--seed", "1180591620717411303424"], "--seed must be a whole number between 0 and 2^63 - 1"),
    (["--threads", "-1"], "--threads must be a positive whole number"),
    (["--sample-length", "-5"], "--sample-length must be at least 1"),
    (["--max-time", "0"], "--max-time is in minutes and must be above 0"),
    (["--device", "banana"], "--device 'banana' is not a device"),
    (["--preset", "transformer-tiny"], "a transformer model has no vocab_size"),
    (["--val-data", "x.tsv"], "--val-data and --batch-tokens are for --task translate"),
    (["--max-tokens", "1000"], "--val-data and --batch-tokens are for --task translate"),  # the old name of it
    (["--d-model", "1000000000", "--n-heads", "1"], "this model does not fit any machine"),
    (["--batch-size", "1000000000000"], "this model does not fit: training it needs at least"),
    (["--n-layers", "100000"], "this model does not fit: training it needs at least"),
]


@pytest.mark.parametrize(("extra", "fragment"), TRAIN_FLAGS, ids=[" ".join(e) for e, _ in TRAIN_FLAGS])
def test_bad_train_flags(tmp_path, capsys, extra, fragment) -> None:
    data = tmp_path / "data.txt"
    data.write_text(GOOD_TEXT)
    run = tmp_path / "run"
    assert_one_line_error(*run_cli(capsys, *train_args(data, run), *extra), fragment)
    assert not (run / "model.safetensors").exists()


# (TOML text, a fragment of the one line it gets)
TOML_FILES = [
    ('lr = "fast"\n', "setting lr = 'fast' must be a number"),
    ("model = 5\n", "must be a [model] table"),
    ('threads = "two"\n', "setting threads = 'two' must be a whole number"),
    ('seed = "abc"\n', "setting seed = 'abc' must be a whole number"),
    ("[model]\nwidth = 64\n", "a gpt model has no width"),
    ("[model]\nvocab_size = 64\n", "vocab_size"),
    ("lr = \n", "is not valid TOML"),
]


@pytest.mark.parametrize(("toml", "fragment"), TOML_FILES)
def test_bad_toml_settings(tmp_path, capsys, toml, fragment) -> None:
    data, config = tmp_path / "data.txt", tmp_path / "settings.toml"
    data.write_text(GOOD_TEXT)
    config.write_text(toml)
    code, err = run_cli(capsys, *train_args(data, tmp_path / "run"), "--config", str(config))
    assert_one_line_error(code, err, fragment)


def test_a_gpt_preset_for_a_translator(tmp_path, capsys) -> None:
    code, err = run_cli(capsys, "train", "--task", "translate", "--preset", "gpt-nano", "--steps", "4", "--quiet")
    assert_one_line_error(code, err, "gpt")


@pytest.fixture
def run_dir(tiny_run):
    return tiny_run


MODEL_VERBS = [
    ["generate", "{run}", "--max-new-tokens", "2"],
    ["eval", "{run}", "{data}"],
    ["next", "{run}", "hello"],
    ["explain", "hello", "--run", "{run}"],
    ["attention", "{run}", "hello", "--out", "{tmp}/a.png"],
    ["lens", "{run}", "hello world", "--out", "{tmp}/l.png"],
    ["heads", "{run}", "--out", "{tmp}/h.png"],
    ["embeddings", "{run}", "--neighbours", "h"],
]


def _verb_args(verb: list[str], run, tmp) -> list[str]:
    data = run.parent / "data.txt"
    return [a.format(run=run, data=data, tmp=tmp) for a in verb]


@pytest.mark.parametrize("verb", MODEL_VERBS, ids=[v[0] for v in MODEL_VERBS])
@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--device", "banana"], "--device 'banana' is not a device"),
        (["--device", "cuda:7"], "cuda"),
        (["--threads", "-1"], "--threads must be a positive whole number"),
        (["--threads", "0"], "--threads must be a positive whole number"),
    ],
)
def test_every_model_verb_checks_device_and_threads(run_dir, tmp_path, capsys, verb, flags, fragment) -> None:
    if flags == ["--device", "cuda:7"] and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert_one_line_error(*run_cli(capsys, *_verb_args(verb, run_dir, tmp_path), *flags), fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")
@pytest.mark.parametrize("verb", MODEL_VERBS, ids=[v[0] for v in MODEL_VERBS])
def test_cuda_without_cuda(run_dir, tmp_path, capsys, verb) -> None:
    code, err = run_cli(capsys, *_verb_args(verb, run_dir, tmp_path), "--device", "cuda")
    assert_one_line_error(code, err, "no CUDA GPU is available: use --device cpu or auto")


def test_translate_batch_size_zero(run_dir, capsys) -> None:
    code, err = run_cli(capsys, "translate", str(run_dir), "--batch-size", "0", "a sentence")
    assert_one_line_error(code, err, "--batch-size must be at least 1")


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"d_model": 10**9, "n_heads": 1, "n_kv_heads": 1}, "this model does not fit"),
        ({"n_layers": 10**7}, "this model does not fit: its"),
    ],
)
def test_a_config_json_too_large_to_load(run_dir, tmp_path, capsys, change, fragment) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "tokenizer.json").write_bytes((run_dir / "tokenizer.json").read_bytes())
    config = json.loads((run_dir / "config.json").read_text())
    (big / "config.json").write_text(json.dumps({**config, **change}))
    (big / "model.safetensors").write_bytes((run_dir / "model.safetensors").read_bytes())
    assert_one_line_error(*run_cli(capsys, "generate", str(big)), fragment)


def test_resume_with_steps_behind_the_checkpoint(run_dir, capsys) -> None:
    code, err = run_cli(capsys, "train", "--resume", str(run_dir), "--steps", "2")
    assert_one_line_error(code, err, "is at step 4, past --steps 2: give --steps above 4")
