"""`qkv train`, `qkv generate`, `qkv eval` and `qkv plot` as a user types them, on a tiny run."""

from __future__ import annotations

import json
import math
import struct

import pytest

from qkv.cli import main

TEXT = "".join(f"Line {i}: the cat sat on the mat, and the dog ran to the park.\n" for i in range(150))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple:
    tmp = tmp_path_factory.mktemp("lm")
    data = tmp / "corpus.txt"
    data.write_text(TEXT)
    run = tmp / "run"
    code = main(
        [
            "train",
            "--data",
            str(data),
            "--preset",
            "gpt-nano",
            "--steps",
            "60",
            "--batch-size",
            "8",
            "--warmup-steps",
            "5",
            "--eval-interval",
            "30",
            "--eval-batches",
            "2",
            "--context-length",
            "48",
            "--out-dir",
            str(run),
            "--quiet",
            "--sample-length",
            "30",
        ]
    )
    assert code == 0
    return run, data


def test_train_writes_a_complete_run_and_prints_samples(trained, capsys) -> None:
    run, _ = trained
    for name in ("model.safetensors", "config.json", "tokenizer.json", "train_config.json", "loss.png"):
        assert (run / name).is_file()
    assert (run / "checkpoints" / "latest.json").is_file()


def test_generate_is_repeatable_with_a_seed_and_greedy_at_temperature_zero(trained, capsys) -> None:
    run, _ = trained
    outputs = []
    for args in (["--seed", "3"], ["--seed", "3"], ["--seed", "4"], ["--temperature", "0"], ["--temperature", "0"]):
        assert main(["generate", str(run), "--prompt", "Line 7", "--max-new-tokens", "40", *args]) == 0
        outputs.append(capsys.readouterr().out)
    assert all(o.startswith("Line 7") for o in outputs)
    assert outputs[0] == outputs[1] and outputs[3] == outputs[4]
    assert outputs[0] != outputs[2]
    assert main(["generate", str(run), "--prompt", "Line", "--num-samples", "2", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.count("--- sample") == 2


def test_every_engine_generates_the_same_greedy_text(trained, capsys) -> None:
    run, _ = trained
    outputs = []
    for engine in ("auto", "model", "static"):
        args = ["generate", str(run), "--prompt", "Line 3", "--max-new-tokens", "30", "--temperature", "0"]
        assert main([*args, "--engine", engine]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] == outputs[2]
    assert main(["generate", str(run), "--prompt", "Line", "--engine", "graph"]) == 2  # no CUDA graphs on a CPU
    err = capsys.readouterr().err.strip()
    assert "replays CUDA graphs, but the model is on cpu" in err and len(err.splitlines()) == 1


def test_prompt_lookup_writes_the_greedy_text_in_fewer_passes_and_refuses_sampling(
    trained, capsys, checked_drafts
) -> None:
    run, _ = trained
    base = ["generate", str(run), "--prompt", "Line 3: the cat sat", "--max-new-tokens", "25"]
    assert main([*base, "--temperature", "0"]) == 0
    greedy = capsys.readouterr().out
    assert not checked_drafts
    for flags in (
        ["--prompt-lookup", "5"],
        ["--prompt-lookup", "3", "--temperature", "0", "--step", "model"],
        ["--prompt-lookup", "4", "--temperature", "0.000001"],  # below 1e-5: greedy, as SamplingParams says
    ):
        assert main([*base, *flags]) == 0  # greedy by default with --prompt-lookup
        out, err = capsys.readouterr()
        assert out == greedy
        passes = int(err.split(" passes of the model (--prompt-lookup)")[0].rsplit(", ", 1)[1])
        assert passes < 25 and "25 tokens in" in err  # some drafted tokens were kept
    assert checked_drafts
    for flags, named in ((["--temperature", "0.8"], "--temperature 0.8"),
                         (["--repetition-penalty", "1.2"], "--repetition-penalty 1.2"),
                         (["--presence-penalty", "0.5"], "--presence-penalty 0.5"),
                         (["--frequency-penalty", "-0.5"], "--frequency-penalty -0.5")):  # fmt: skip
        assert main([*base, "--prompt-lookup", "5", *flags]) == 2
        err = capsys.readouterr().err
        assert f"checks its drafts against greedy decoding, which {named} changes" in err and err.count("\n") == 1
    assert main([*base, "--prompt-lookup", "-1"]) == 2
    assert "prompt_lookup=-1 must be a whole number >= 0" in capsys.readouterr().err
    assert main([*base, "--prompt-lookup", "5", "--no-cache"]) == 2
    err = capsys.readouterr().err
    assert "use_cache=False (--no-cache) recomputes every step" in err and err.count("\n") == 1


def test_long_prompts_are_cropped_with_a_notice(trained, capsys) -> None:
    run, _ = trained
    assert main(["generate", str(run), "--prompt", TEXT[:200], "--max-new-tokens", "5", "--temperature", "0"]) == 0
    assert "first 152 tokens were dropped" in capsys.readouterr().err  # 200 characters, context 48


def test_eval_reports_consistent_numbers(trained, capsys) -> None:
    run, data = trained
    assert main(["eval", str(run), str(data), "--json"]) == 0
    score = json.loads(capsys.readouterr().out)
    assert score["perplexity"] == pytest.approx(math.exp(score["loss"]))
    assert score["bits_per_token"] == pytest.approx(score["loss"] / math.log(2))
    assert score["bits_per_char"] == pytest.approx(score["bits_per_token"])  # char-level: one char per token
    assert score["loss"] < math.log(30)  # learned something: better than uniform over ~30 characters


def test_plot_command(trained, tmp_path, capsys) -> None:
    run, _ = trained
    out = tmp_path / "curve.png"
    assert main(["plot", str(run), "--out", str(out)]) == 0
    header = out.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (770, 440)


def test_a_finished_run_is_not_overwritten(trained, capsys) -> None:
    run, data = trained
    assert main(["train", "--data", str(data), "--out-dir", str(run), "--quiet"]) == 2
    assert "already holds a training run" in capsys.readouterr().err
