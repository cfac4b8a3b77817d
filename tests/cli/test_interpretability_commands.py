"""`qkv lens`, `qkv attribute`, `qkv patch` and `qkv heads` as a user types them: JSON, pictures, tables
that fit 80 columns, and one clear line (exit 2) for input that cannot work."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.cli import main
from qkv.inspect import png_size
from qkv.model_dir import save_model_dir
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Transformer, TransformerConfig
from qkv.tokenizers import CharTokenizer
from tests.inspect.conftest import perturb
from tests.pretrained.conftest import gpt2_dir  # noqa: F401  (session fixture)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A pre-LN GPT, a post-LN translator and an encoder, saved as run directories."""
    tok = CharTokenizer.train("the quick brown fox jumps over the lazy dog")
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=2, context_length=32))
    perturb(gpt)
    translator = Transformer(TransformerConfig(
        src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_encoder_layers=1,
        n_decoder_layers=2, context_length=24, norm_first=False,
    ))  # fmt: skip
    perturb(translator)
    encoder = Encoder(EncoderConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, context_length=24))
    root = tmp_path_factory.mktemp("interp-cli")
    return {name: str(save_model_dir(root / name, model, tok))
            for name, model in (("gpt", gpt), ("translator", translator), ("encoder", encoder))}  # fmt: skip


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def printed(capsys, monkeypatch, *argv: str) -> str:
    """The terminal output on a wide console: the tables must fit 80 columns by themselves."""
    monkeypatch.setenv("COLUMNS", "200")
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    return out


def fails(capsys, *argv: str) -> str:
    """Run a command that must fail: exit code 2 and one line on stderr, no traceback."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_lens_json_table_and_heatmap(capsys, monkeypatch, runs, tmp_path) -> None:
    out = tmp_path / "lens.png"
    data = run_json(capsys, "lens", runs["gpt"], "the quick", "--top", "2", "--out", str(out), "--json")
    assert data["rows"] == ["embedding", "block 0", "block 1"] and data["norm"] == "final LayerNorm"
    assert len(data["top"][2][8]) == 2 and data["final_ranks"][2] == [0] * 9
    assert png_size(out) == png_size(data["plot"]) and png_size(out)[0] > 500
    text = printed(capsys, monkeypatch, "lens", runs["gpt"], "the quick", "--no-plot")
    assert "embedding" in text and "block 1" in text and "#1" in text
    text = printed(capsys, monkeypatch, "lens", runs["gpt"], "the quick", "--layer", "0", "--no-plot")
    assert "8 'k'" in text
    text = printed(capsys, monkeypatch, "lens", runs["translator"], "the fox", "--target", "over", "--no-plot")
    assert "post-LN" in text and "decoder input: <bos> o v e r" in text


def test_attribute_sums_to_the_logit(capsys, monkeypatch, runs, tmp_path) -> None:
    out = tmp_path / "attribution.png"
    data = run_json(capsys, "attribute", runs["gpt"], "the quick", "--foil", "z", "--out", str(out), "--json")
    assert data["total"] == pytest.approx(data["logit"], abs=1e-4) and data["foil"]["token"] == "z"
    assert len(data["heads"]) == 2 and png_size(out)[0] > 500
    text = printed(capsys, monkeypatch, "attribute", runs["gpt"], "the quick", "--layer", "1", "--no-plot")
    assert "sum of the parts" in text and "block 1 head 1" in text and "block 0 head" not in text


def test_patch_lists_the_sites_that_recover_most(capsys, monkeypatch, runs, tmp_path) -> None:
    out = tmp_path / "patch.png"
    data = run_json(capsys, "patch", runs["gpt"], "--clean", "the quick", "--corrupt", "the quack", "--foil", "z",
                    "--out", str(out), "--json")  # fmt: skip
    residual = data["maps"][0]
    assert residual["name"] == "residual" and residual["values"][2][8] == pytest.approx(1.0, abs=1e-5)
    assert png_size(out)[0] > 500
    text = printed(capsys, monkeypatch, "patch", runs["translator"], "--clean", "the fox", "--corrupt", "the fix",
                   "--foil", "z", "--no-plot")  # fmt: skip
    assert "Encoder residual stream" in text and "Cross-attention heads" in text


def test_heads_on_a_gpt2_folder_and_a_translator(capsys, monkeypatch, runs, gpt2_dir, tmp_path) -> None:  # noqa: F811
    out = tmp_path / "heads.png"
    data = run_json(capsys, "heads", "--model", str(gpt2_dir), "--bos", "--length", "12", "--top", "3", "--out",
                    str(out), "--json")  # fmt: skip
    decoder = data["parts"]["decoder"]
    assert decoder["first"] == "<|endoftext|>" and len(decoder["scores"]["induction"]) == 2
    assert [h["score"] for h in decoder["top"]["induction"]] == sorted(
        (h["score"] for h in decoder["top"]["induction"]), reverse=True)  # fmt: skip
    assert png_size(out)[0] > 500
    text = printed(capsys, monkeypatch, "heads", "--model", str(gpt2_dir), "--no-plot")
    assert "previous-token" in text and "induction" in text
    text = printed(capsys, monkeypatch, "heads", runs["translator"], "--layer", "1", "--no-plot")
    assert "decoder masked self-attention" in text and "encoder self-attention" not in text


def test_heads_runs_on_smollm2s_gguf_file(capsys, smollm2) -> None:
    """The 30-layer model with an 8,192-token context: the memory check sizes the 2 x 2 x 10 tokens fed (it once
    sized the context and refused with "1,763 GiB")."""
    data = run_json(capsys, "heads", "--model", str(smollm2), "--batch", "2", "--length", "10", "--json", "--no-plot")
    assert data["length"] == 10 and np.array(data["parts"]["decoder"]["scores"]["induction"]).shape == (30, 9)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["lens", "GPT", "the fox", "--layer", "2"], "--layer 2 is out of range: the decoder has layers 0..1"),
        (["lens", "GPT", "the fox", "--position", "fix"], "--position 'fix' is not one of the tokens"),
        (["lens", "ENCODER", "the fox"], "needs an unembedding, and an encoder"),
        (["attribute", "GPT", "the fox", "--token", "ox"], "--token 'ox' is 2 tokens ('o', 'x'), not one"),
        (["attribute", "GPT", "the fox", "--target", "ox"], "--target is for translators"),
        (["patch", "GPT", "--clean", "the fox", "--corrupt", "the fix", "--prefix", "x"],
         "--target is for translators"),
        (["attribute", "GPT", "the fox", "--token", "o", "--foil", "o"], "--foil is the same token as --token"),
        (["attribute", "GPT", "the fox", "--layer", "5"], "--layer 5 is out of range"),
        (["attribute", "TRANSLATOR", "the fox"], "needs a pre-LN model"),
        (["patch", "GPT", "--clean", "the fox", "--corrupt", "the foxes"],
         "the clean prompt is 7 tokens and the corrupt one 9"),
        (["patch", "GPT", "--clean", "the fox", "--corrupt", "the fix", "--foil", "ab"], "--foil 'ab' is 2 tokens"),
        (["heads", "GPT", "--head", "2"], "--head 2 is out of range: each layer has heads 0..1"),
        (["heads", "GPT", "--layer", "-1"], "--layer -1 is out of range"),
        (["heads", "GPT", "--length", "99"], "--length 99 does not fit"),
        (["heads", "TRANSLATOR", "--layer", "3"], "--layer 3 is out of range: the encoder self-attention has"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(capsys, runs, argv, message) -> None:
    names = {"GPT": runs["gpt"], "TRANSLATOR": runs["translator"], "ENCODER": runs["encoder"]}
    assert message in fails(capsys, *[names.get(a, a) for a in argv])
