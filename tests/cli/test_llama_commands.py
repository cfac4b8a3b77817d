"""A new family through every verb with no family-specific code: a tiny Llama run folder, run as a user types
the commands, each answer checked against the model itself. A ``kind == "gpt"`` test left anywhere on the way
fails here, since a Llama's kind is "llama"."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from qkv.cli import main
from qkv.decoding import generate
from qkv.model_dir import load_model_dir, save_model_dir
from qkv.models import LlamaConfig
from qkv.models.family import family_of
from qkv.models.llama import Llama
from qkv.tokenizers import CharTokenizer
from tests.inspect.conftest import perturb

# Where a verb's numbers come from qkv.inspect (converted on another branch) or its loading from
# qkv.cli.common.load_for_use (converted by another helper), it still tests kinds there until those land.
TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> str:
    """A random tiny Llama (2 layers, 4 heads, context 64), weights far from uniform, saved as a run folder."""
    tokenizer = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=2, context_length=64))
    perturb(model)
    return str(save_model_dir(tmp_path_factory.mktemp("llama-cli") / "llama", model, tokenizer))


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def logits_of(run: str, text: str) -> torch.Tensor:
    """The model's own logits (T, vocab) for ``text``, from the saved folder."""
    bundle = load_model_dir(run)
    with torch.no_grad():
        return bundle.model(torch.tensor([bundle.tokenizer.encode(text)]))[0].double()


def test_generate_greedy_is_the_models_argmax(capsys, llama) -> None:
    assert main(["generate", llama, "--prompt", "the qu", "--max-new-tokens", "12", "--temperature", "0"]) == 0
    bundle = load_model_dir(llama)
    ids = bundle.tokenizer.encode("the qu")
    new = generate(bundle.model, ids, max_new_tokens=12, temperature=0, eos_id=bundle.tokenizer.eos_id)
    new = new[0, len(ids) :].tolist()
    new = new[: new.index(bundle.tokenizer.eos_id)] if bundle.tokenizer.eos_id in new else new
    assert capsys.readouterr().out == "the qu" + bundle.tokenizer.decode(new) + "\n"


def test_eval_loss_is_the_cross_entropy_of_its_predictions(capsys, llama, tmp_path) -> None:
    (tmp_path / "text.txt").write_text(TEXT)
    score = run_json(capsys, "eval", llama, str(tmp_path / "text.txt"), "--json")
    ids = torch.tensor(load_model_dir(llama).tokenizer.encode(TEXT))  # 43 characters: within the context of 64
    expected = F.cross_entropy(logits_of(llama, TEXT)[:-1], ids[1:]).item()
    assert score["loss"] == pytest.approx(expected, abs=1e-5)
    assert score["perplexity"] == pytest.approx(math.exp(expected)) and score["tokens"] == len(TEXT) - 1


def test_next_shows_the_softmax_of_its_logits(capsys, llama) -> None:
    data = run_json(capsys, "next", llama, "the qu", "--top", "3", "--no-plot", "--json")
    probs = torch.softmax(logits_of(llama, "the qu")[-1], -1)
    assert [t["id"] for t in data["top"]] == probs.topk(3).indices.tolist()
    assert data["top"][0]["probabilities"]["1"] == pytest.approx(probs.max().item(), abs=1e-6)


def test_attention_draws_causal_self_attention(capsys, llama, tmp_path) -> None:
    out = tmp_path / "attention.png"
    data = run_json(capsys, "attention", llama, "the quick", "--out", str(out), "--json")
    assert data["kind"] == "llama" and list(data["groups"]) == ["decoder"] and out.is_file()
    w = torch.tensor(data["groups"]["decoder"]["weights"])
    assert w.shape == (2, 4, 9, 9) and (w.triu(1) == 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 9), atol=1e-3, rtol=0)


def test_explain_run_recomputes_the_models_head(capsys, llama) -> None:
    data = run_json(capsys, "explain", "the fox", "--run", llama, "--layer", "1", "--head", "2", "--json")
    assert data["causal"] and data["part"] == "decoder" and data["n_heads"] == 4 and data["d_k"] == 8
    assert data["model_difference"] < 1e-5  # the step-by-step numbers are what the model's own head computes


def test_lens_last_row_is_the_models_prediction(capsys, llama) -> None:
    data = run_json(capsys, "lens", llama, "the quick", "--no-plot", "--json")
    assert data["kind"] == "llama" and data["rows"] == ["embedding", "block 0", "block 1"]
    assert [f["id"] for f in data["final"]] == logits_of(llama, "the quick").argmax(-1).tolist()
    assert data["final_ranks"][-1] == [0] * 9


def test_lens_html_writes_the_walkthrough(capsys, llama, tmp_path) -> None:
    page = tmp_path / "walk.html"
    assert main(["lens", llama, "the quick", "--no-plot", "--html", str(page)]) == 0
    assert page.is_file() and "wrote" in capsys.readouterr().out and page.stat().st_size > 10_000


def test_attribute_sums_to_the_models_logit(capsys, llama) -> None:
    data = run_json(capsys, "attribute", llama, "the quick", "--no-plot", "--json")
    logits = logits_of(llama, "the quick")[-1]
    assert data["target"]["id"] == int(logits.argmax())
    assert data["logit"] == pytest.approx(logits.max().item(), abs=1e-4)
    assert data["total"] == pytest.approx(data["logit"], abs=1e-4) and len(data["heads"]) == 2


def test_patch_starts_from_the_models_logit_difference(capsys, llama) -> None:
    logits = logits_of(llama, "the quick")[-1]
    foil = "z" if load_model_dir(llama).tokenizer.decode([int(logits.argmax())]) != "z" else "y"
    argv = ["--clean", "the quick", "--corrupt", "the quack", "--foil", foil, "--no-plot", "--json"]
    data = run_json(capsys, "patch", llama, *argv)
    assert data["target"]["id"] == int(logits.argmax()) and data["foil"]["token"] == foil
    expected = logits[data["target"]["id"]] - logits[data["foil"]["id"]]
    assert data["kind"] == "llama" and data["clean_difference"] == pytest.approx(expected.item(), abs=1e-4)
    assert [m["name"] for m in data["maps"]] == ["residual", "heads"] and len(data["maps"][1]["values"]) == 2


def test_heads_scores_every_layer_and_head(capsys, llama) -> None:
    data = run_json(capsys, "heads", llama, "--length", "16", "--no-plot", "--json")
    assert data["kind"] == "llama" and list(data["parts"]) == ["decoder"]
    for scores in data["parts"]["decoder"]["scores"].values():
        assert torch.tensor(scores).shape == (2, 4)


def test_a_target_is_refused_with_the_familys_title(capsys, llama) -> None:
    title = family_of("llama").title
    for argv, end in (
        (["next", llama, "the", "--target", "x", "--no-plot"], "continues the prompt itself"),
        (["lens", llama, "the", "--target", "x", "--no-plot"], "reads one text"),
        (["attention", llama, "the", "--target", "x"], "reads one text"),
    ):
        assert main(argv) == 2
        assert capsys.readouterr().err == f"qkv {argv[0]}: error: --target is for translators: {title} {end}\n"


SAMPLING = [["--temperature", "0"], ["--temperature", "0.9", "--top-p", "0.9", "--seed", "3"]]


@pytest.mark.parametrize("sampling", SAMPLING)
def test_generate_streams_the_same_text_with_every_engine(capsys, llama, sampling) -> None:
    """The CLI streams tokens as they come; the reference forward and the static-cache step (the cache holds
    n_kv_heads heads) write the same text, greedy or seeded sampling."""
    texts = {}
    for engine in ("model", "static"):
        argv = ["generate", llama, "--prompt", "the ", "--max-new-tokens", "16", "--engine", engine, *sampling]
        assert main(argv) == 0
        texts[engine] = capsys.readouterr().out
    assert texts["model"] == texts["static"] and len(texts["model"]) > len("the ")
