"""`qkv explain`, `qkv attention`, `qkv next` and `qkv embeddings` as a user types them."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qkv.cli import main
from qkv.inspect import png_size
from tests.cli.conftest import gpt_and_translator

QUICK_FOX_Q = [[0.1, 0.2], [0.5, 0.6], [0.9, 1.0], [1.3, 1.4], [1.7, 1.8]]
QUICK_FOX_K = [[0.2, 0.1], [0.6, 0.5], [1.0, 0.9], [1.4, 1.3], [1.8, 1.7]]
QUICK_FOX_V = [[0.3, 0.4], [0.7, 0.8], [1.1, 1.2], [1.5, 1.6], [1.9, 2.0]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return gpt_and_translator(tmp_path_factory.mktemp("inspect-cli"), gpt_context=32)


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def fails(capsys, *argv: str) -> str:
    """Run a command that must fail: exit code 2 and one line on stderr, no traceback."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def seed_004_weights(causal: bool = False) -> np.ndarray:
    scores = np.array(QUICK_FOX_Q) @ np.array(QUICK_FOX_K).T / math.sqrt(2)
    if causal:
        scores[np.triu_indices(5, k=1)] = -np.inf
    e = np.exp(scores - scores.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_explain_with_no_arguments_prints_seed_004_step_by_step(capsys) -> None:
    assert main(["explain"]) == 0
    out = capsys.readouterr().out
    for expected in ("The", "quick", "jumps", "0.1600", "1.9200", "0.7071", "0.0976", "0.3389", "1.3390", "1.4390"):
        assert expected in out
    assert "0.5×0.2 + 0.6×0.1" in out  # the dot product written out for "quick"


@pytest.mark.parametrize("causal", [False, True])
def test_explain_json_gives_the_same_numbers(capsys, causal: bool) -> None:
    flags = ["--causal"] if causal else []
    data = run_json(capsys, "explain", "The quick brown fox jumps", "--json", *flags)
    np.testing.assert_allclose(np.array(data["weights"]), seed_004_weights(causal), atol=1e-12)
    assert data["query"] == 1 and data["query_tokens"][1] == "quick" and data["causal"] is causal
    assert (data["masked"][0][1] is None) is causal


def test_explain_reads_your_matrices(capsys, tmp_path) -> None:
    path = tmp_path / "qkv.json"
    path.write_text(json.dumps({"Q": QUICK_FOX_Q, "K": QUICK_FOX_K, "V": QUICK_FOX_V}))
    data = run_json(capsys, "explain", "The quick brown fox jumps", "--qkv", str(path), "--query", "fox", "--json")
    np.testing.assert_allclose(np.array(data["weights"]), seed_004_weights(), atol=1e-12)
    assert data["query"] == 3
    table = tmp_path / "x.csv"
    table.write_text("token,x1,x2,x3,x4\n" + "\n".join(f"w{i},{i},1,0,{-i}" for i in range(4)) + "\n")
    data = run_json(capsys, "explain", "--embeddings", str(table), "--heads", "2", "--d-k", "3", "--json")
    assert np.array(data["heads"]["concat"]).shape == (4, 6) and data["n_heads"] == 2
    assert data["query_tokens"] == ["w0", "w1", "w2", "w3"] and len(data["projections"]["W_q"]) == 4


def test_explain_seed_003_and_a_model(capsys, runs) -> None:
    data = run_json(capsys, "explain", "--example", "journey", "--json")
    assert [round(w, 4) for w in data["weights"][1]] == [0.1385, 0.2379, 0.2333, 0.124, 0.1082, 0.1581]
    gpt, translator = runs
    data = run_json(capsys, "explain", "the fox", "--run", str(gpt), "--layer", "1", "--head", "1", "--json")
    assert data["model_difference"] < 1e-6 and data["causal"] and len(data["heads"]["output"][0]) == 16
    assert main(["explain", "the fox", "--run", str(translator), "--part", "cross", "--target", "fox"]) == 0
    out = capsys.readouterr().out
    assert "cross-attention" in out and "concatenated" in out and "equal to the weights the model computed" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--query", "dog"], "--query 'dog' is not one of the tokens"),
        (["--example", "journey", "--query", "9"], "--query 9 is out of range"),
        (["the fox", "--run", "GPT", "--layer", "7"], "--layer 7 is out of range"),
        (["the fox", "--run", "GPT", "--head", "2"], "--head 2 is out of range"),
        (["the fox", "--run", "GPT", "--example", "004"], "give one source of numbers"),
        (["--qkv", "BAD"], "not valid JSON"),
        (["--qkv", "missing.json"], "does not exist"),
    ],
)
def test_explain_bad_input_is_one_line(capsys, runs, tmp_path, argv, message) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{'Q': [1, 2]")
    argv = [str(runs[0]) if a == "GPT" else str(bad) if a == "BAD" else str(tmp_path / a) if a.endswith(".json")
            else a for a in argv]  # fmt: skip
    assert message in fails(capsys, "explain", *argv)


def test_attention_draws_the_grid_and_the_html_view(capsys, runs, tmp_path) -> None:
    gpt, translator = runs
    out = tmp_path / "att.png"
    data = run_json(capsys, "attention", str(gpt), "the lazy dog", "--out", str(out), "--html", "--json")
    assert data["pictures"][0]["panels"] == 4 and png_size(out) == (data["pictures"][0]["width"],
                                                                     data["pictures"][0]["height"])  # fmt: skip
    weights = np.array(data["groups"]["decoder"]["weights"])
    np.testing.assert_allclose(weights.sum(axis=-1), 1.0, atol=1e-5)
    page = (tmp_path / "att.html").read_text()
    assert '"key_tokens":["t","h","e","␣","l","a","z","y"' in page
    assert main(["attention", str(translator), "the fox", "--out", str(out), "--layer", "0"]) == 0
    printed = capsys.readouterr().out
    for part in ("encoder", "decoder", "cross"):
        assert png_size(tmp_path / f"att-{part}.png")[0] > 200 and f"att-{part}.png (2 maps" in printed
    assert "greedy translation" in printed
    assert main(["attention", str(translator), "the fox", "--target", "dog", "--part", "cross", "--head", "1",
                 "--out", str(tmp_path / "cross.png")]) == 0  # fmt: skip
    assert "cross.png (1 map," in capsys.readouterr().out
    assert "no cross attention" in fails(capsys, "attention", str(gpt), "the fox", "--part", "cross")
    assert "--layer 3 is out of range" in fails(capsys, "attention", str(gpt), "the fox", "--layer", "3")
    assert main(["attention", str(gpt), "the fox", "--layer", "0-1", "--head", "1,0", "--out", str(out)]) == 0
    assert "(4 maps," in capsys.readouterr().out  # a range and a list: their grid
    assert "--layer 3 is out of range" in fails(capsys, "attention", str(gpt), "the fox", "--layer", "1,3")
    with pytest.raises(SystemExit) as stopped:  # argparse's one line (the parser's type check)
        main(["attention", str(gpt), "the fox", "--head", "x"])
    assert stopped.value.code == 2 and "a list (0,5,10) or a range (16-18)" in capsys.readouterr().err


def test_next_prints_the_distribution_and_draws_it(capsys, runs, tmp_path) -> None:
    gpt, translator = runs
    plot = tmp_path / "next.png"
    data = run_json(capsys, "next", str(gpt), "the qu", "--top", "4", "--plot", str(plot), "--json")
    assert len(data["top"]) == 4 and data["plot"] == str(plot) and png_size(plot)[0] > 300
    logits = [t["logit"] for t in data["top"]]
    assert logits == sorted(logits, reverse=True)
    assert data["entropy"]["0.5"] < data["entropy"]["1"] < data["entropy"]["2"]
    assert main(["next", str(gpt), "the qu", "--no-plot", "--temperatures", "1", "3"]) == 0
    out = capsys.readouterr().out
    assert "P (T=1)" in out and "P (T=3)" in out and "all other tokens" in out
    data = run_json(capsys, "next", str(translator), "the fox", "--target", "do", "--no-plot", "--json")
    assert data["context_tokens"] == ["<bos>", "d", "o"]
    data = run_json(
        capsys, "next", str(gpt), "the qu", "--no-plot", "--json", "--temperatures", "0", "1", "--top-k", "2"
    )
    assert data["kept"] == {"0": 1, "1": 2} and data["top_k"] == 2  # T = 0 is greedy; top-k as sampling
    assert sum(t["probabilities"]["1"] for t in data["top"][:2]) == pytest.approx(1)
    assert "temperatures must be numbers >= 0" in fails(capsys, "next", str(gpt), "the", "--temperatures", "-1")
    assert "--target is for translators" in fails(capsys, "next", str(gpt), "the", "--target", "x")


def test_embeddings_answers_and_pictures(capsys, runs, tmp_path, monkeypatch) -> None:
    gpt, translator = runs
    data = run_json(
        capsys, "embeddings", str(gpt), "--neighbours", "e", "--analogy", "a", "b", "c", "-k", "3", "--json"
    )
    assert len(data["neighbours"]["e"]) == 3 and data["pictures"] == []
    assert {t for t, _ in data["analogy"]["answers"]}.isdisjoint({"a", "b", "c"})
    monkeypatch.chdir(tmp_path)
    assert main(["embeddings", str(translator), "--target-side"]) == 0
    assert png_size(translator / "embeddings.png") == (850, 700) and png_size(translator / "positions.png")[0] > 300
    assert not list(tmp_path.glob("*.png"))  # pictures go to the run folder
    assert main(["embeddings", "--positions", "pe.png", "--d-model", "32", "--length", "20"]) == 0
    assert (tmp_path / "pe.png").is_file()
    assert "which model?" in fails(capsys, "embeddings", "--neighbours", "e")
    assert "not one token" in fails(capsys, "embeddings", str(gpt), "--neighbours", "king")
