"""`qkv quantize`, `--quantize int8` on generate, translate, embed, eval and serve, and the bad inputs of
quantizing and exporting, as a user types them."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from qkv.cli import main
from qkv.data.builtin import calibration_sample
from qkv.loading import load
from qkv.model_dir import QUANTIZATION_FILE, save_model_dir
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, LlamaConfig, Transformer, TransformerConfig
from qkv.models.llama import Llama
from qkv.quantization import Int4Linear, Int8Linear, is_quantized, quantize_model, set_activations
from qkv.quantization.format import quantization_info
from qkv.quantization.smoothing import smoothing_feed
from qkv.tokenizers import CharTokenizer

TEXT = "the quick brown fox jumps over the lazy dog. a man is eating food. the girl carries a baby.\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tok = CharTokenizer.train(TEXT)
    torch.manual_seed(0)
    small = dict(d_model=32, n_heads=2, context_length=48)
    models = {
        "decoder": GPT(GPTConfig(vocab_size=tok.vocab_size, n_layers=2, **small)),
        "translator": Transformer(
            TransformerConfig(
                src_vocab_size=tok.vocab_size,
                tgt_vocab_size=tok.vocab_size,
                n_encoder_layers=1,
                n_decoder_layers=1,
                **small,
            )
        ),  # fmt: skip
        "encoder": Encoder(EncoderConfig(vocab_size=tok.vocab_size, n_layers=2, **small)),
        "gated decoder": Llama(
            LlamaConfig(vocab_size=tok.vocab_size, n_layers=2, n_kv_heads=1, qkv_bias=True, **small)
        ),
    }
    root = tmp_path_factory.mktemp("deploy")
    (root / "text.txt").write_text(TEXT * 3)
    runs = {name: str(save_model_dir(root / name, model, tok)) for name, model in models.items()}
    assert main(["quantize", runs["decoder"], "--out", str(root / "gpt-int8")]) == 0
    return {**runs, "gpt-int8": str(root / "gpt-int8"), "text": str(root / "text.txt"), "root": root}


def output(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def fails(capsys, *argv: str) -> str:
    """A command that must fail: exit code 2 and one line on stderr, no traceback."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_quantize_writes_a_folder_that_loads_as_int8(runs, capsys) -> None:
    folder = runs["root"] / "gpt-int8"
    assert (folder / QUANTIZATION_FILE).is_file() and (folder / "tokenizer.json").is_file()
    assert is_quantized(load(str(folder)).model)
    assert not is_quantized(load(runs["decoder"]).model)  # the original is untouched
    capsys.readouterr()
    assert main(["quantize", runs["decoder"], "--out", str(runs["root"] / "again")]) == 0
    err = capsys.readouterr().err
    assert "int8 weights" in err and "x smaller" in err


@pytest.mark.parametrize("name", ["decoder", "encoder", "gated decoder"])
def test_quantize_with_calibration_text_changes_only_the_roundings(runs, capsys, name) -> None:
    out = runs["root"] / f"{name}-calibrated"
    assert main(["quantize", runs[name], "--out", str(out), "--calibrate", runs["text"]]) == 0
    nearest = load(runs[name], quantize="int8").model
    calibrated = load(str(out)).model
    pairs = [
        (a, b)
        for (key, a), b in zip(nearest.state_dict().items(), calibrated.state_dict().values(), strict=True)
        if key.endswith("qweight") and not key.startswith("unembedding")
    ]
    assert pairs and all(a.dtype == b.dtype == torch.int8 for a, b in pairs)
    assert any(not torch.equal(a, b) for a, b in pairs)  # other integers ...
    for key, value in nearest.state_dict().items():  # ... under the same scales and biases
        if not key.endswith("qweight"):
            torch.testing.assert_close(calibrated.state_dict()[key], value)


def test_quantize_with_activations_rounded_twice_saves_and_loads_that_mode(runs, capsys) -> None:
    """--activations int8x2: saved in quantization.json, loaded that way, not smoothed, and closer to the
    weight-only model's logits than int8 activations are."""
    out = runs["root"] / "gpt-w8a8x2"
    assert main(["quantize", runs["decoder"], "--out", str(out), "--activations", "int8x2", "--group-size", "32"]) == 0
    said = capsys.readouterr().err
    assert "int8 activations rounded twice" in said and "--smooth" not in said  # not smoothed, and not asked to
    written = json.loads((out / QUANTIZATION_FILE).read_text())
    assert written["activations"] == "int8x2" and "smoothed_inputs" not in written
    assert "then what that missed the same way" in written["description"]
    loaded = load(str(out)).model
    assert {m.activations for m in loaded.modules() if isinstance(m, Int8Linear)} == {"int8x2"}
    weight_only = quantize_model(load(runs["decoder"]).model, group_size=32)
    once = set_activations(copy.deepcopy(weight_only), "int8")
    ids = torch.tensor([[3, 5, 7, 2, 9]])
    with torch.no_grad():
        exact = weight_only(ids)
        assert (loaded(ids) - exact).abs().max() < (once(ids) - exact).abs().max() / 20
    assert len(output(capsys, "generate", str(out), "--prompt", "the ", "--max-new-tokens", "8")) > len("the ")
    for flags, why in ((["--activations", "int8x2"], "nothing to gain"), (["--bits", "4"], "16 levels"), ([], "float")):
        again = runs["root"] / f"gpt-smooth-{len(flags)}-{why[:3]}"
        assert main(["quantize", runs["decoder"], "--out", str(again), "--smooth", "on", *flags]) == 0
        said = capsys.readouterr().err
        assert "note: --smooth on had no effect" in said and why in said
        assert "smoothed_inputs" not in json.loads((again / QUANTIZATION_FILE).read_text())


def test_calibration_bad_inputs_are_one_line(runs, capsys) -> None:
    missing = str(runs["root"] / "absent.txt")
    err = fails(capsys, "quantize", runs["decoder"], "--out", str(runs["root"] / "c1"), "--calibrate", missing)
    assert "calibration text" in err and "does not exist" in err
    err = fails(capsys, "quantize", runs["translator"], "--out", str(runs["root"] / "c2"), "--calibrate", runs["text"])
    assert "calibration text works for language models and encoders, and this is an encoder-decoder" in err


def test_quantize_with_int8_activations_saves_and_loads_that_mode(runs, capsys) -> None:
    out = runs["root"] / "gpt-w8a8"
    assert main(["quantize", runs["decoder"], "--out", str(out), "--activations", "int8"]) == 0
    said = capsys.readouterr().err
    assert "int8 activations" in said
    written = json.loads((out / QUANTIZATION_FILE).read_text())
    assert written["activations"] == "int8" and written["smoothed_inputs"] > 0
    assert f"{written['smoothed_inputs']} inputs smoothed" in said
    assert quantization_info(load(str(out)).model)["smoothed_inputs"] == written["smoothed_inputs"]  # saved again
    assert json.loads((runs["root"] / "gpt-int8" / QUANTIZATION_FILE).read_text())["activations"] == "float"
    loaded = load(str(out)).model
    modes = {name: m.activations for name, m in loaded.named_modules() if isinstance(m, Int8Linear)}
    twice = [name for name in modes if name.endswith(("feed_forward.linear2", "unembedding"))]  # W_2 and W_U
    assert len(twice) == loaded.config.n_layers + 1
    assert modes == {name: "int8x2" if name in twice else "int8" for name in modes}
    bundle = load(runs["decoder"])  # smoothed first on Python's documentation (the default), as in Python:
    reference = quantize_model(bundle.model, activations="int8", smoothing=smoothing_feed(bundle, calibration_sample()))
    ids = torch.tensor([[3, 5, 7, 2, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), reference(ids), rtol=0, atol=1e-6)
    plain = runs["root"] / "gpt-w8a8-plain"
    assert main(["quantize", runs["decoder"], "--out", str(plain), "--activations", "int8", "--smooth", "off"]) == 0
    assert "smoothed_inputs" not in json.loads((plain / QUANTIZATION_FILE).read_text())
    unsmoothed = set_activations(quantize_model(load(runs["decoder"]).model), "int8")
    with torch.no_grad():
        torch.testing.assert_close(load(str(plain)).model(ids), unsmoothed(ids), rtol=0, atol=1e-6)
        assert not torch.allclose(loaded(ids), unsmoothed(ids), atol=1e-4)  # smoothing moved some weights
    assert len(output(capsys, "generate", str(out), "--prompt", "the ", "--max-new-tokens", "8")) > len("the ")
    info = json.loads((out / QUANTIZATION_FILE).read_text())
    (out / QUANTIZATION_FILE).write_text(json.dumps({**info, "activations": "int4"}))
    err = fails(capsys, "generate", str(out), "--prompt", "the ")
    assert "activations 'int4'" in err and "quantize the original run again" in err


def test_generate_from_the_quantized_folder_equals_generate_with_the_flag(runs, capsys) -> None:
    common = ["--prompt", "the ", "--temperature", "0", "--max-new-tokens", "20"]
    from_folder = output(capsys, "generate", runs["gpt-int8"], *common)
    with_flag = output(capsys, "generate", runs["decoder"], *common, "--quantize", "int8")
    assert from_folder == with_flag and len(from_folder) > len("the ") + 10


def test_a_llama_quantizes_and_generates_from_its_int8_folder(runs, capsys) -> None:
    out = str(runs["root"] / "llama-int8")
    assert main(["quantize", runs["gated decoder"], "--out", out]) == 0
    model = load(out).model
    assert is_quantized(model) and model.decoder.blocks[0].feed_forward.gate.qweight.dtype == torch.int8
    common = ["--prompt", "the ", "--temperature", "0", "--max-new-tokens", "20"]
    with_flag = output(capsys, "generate", runs["gated decoder"], *common, "--quantize", "int8")
    assert output(capsys, "generate", out, *common) == with_flag


def test_a_llama_quantizes_to_4_bits_and_generates_from_its_int4_folder(runs, capsys) -> None:
    out = str(runs["root"] / "llama-int4")
    assert main(["quantize", runs["gated decoder"], "--out", out, "--bits", "4", "--calibrate", runs["text"]]) == 0
    assert "int4 weights" in capsys.readouterr().err
    info = json.loads((runs["root"] / "llama-int4" / "quantization.json").read_text())
    assert info["scheme"] == "int4" and info["group_size"] == 32 and info["int8_modules"] == ["unembedding"]
    model = load(out).model
    assert isinstance(model.decoder.blocks[0].feed_forward.gate, Int4Linear)
    common = ["--prompt", "the ", "--temperature", "0", "--max-new-tokens", "20"]
    assert output(capsys, "generate", out, *common).startswith("the ")
    nearest = str(runs["root"] / "llama-int4-nearest")
    assert main(["quantize", runs["gated decoder"], "--out", nearest, "--bits", "4"]) == 0
    with_flag = output(capsys, "generate", runs["gated decoder"], *common, "--quantize", "int4")
    assert output(capsys, "generate", nearest, *common) == with_flag


def test_activations_int8_on_generate_rounds_the_int4_layers_inputs(runs, capsys) -> None:
    """--activations int8 (W4A8) gives the tokens of the model whose layers were set so in Python; on a float model
    it is one line."""
    from qkv.decoding import generate

    common = ["--prompt", "the ", "--temperature", "0", "--max-new-tokens", "12"]
    flagged = output(capsys, "generate", runs["gated decoder"], *common, "--quantize", "int4", "--activations", "int8")
    bundle = load(runs["gated decoder"], quantize="int4")
    set_activations(bundle.model, "int8")
    ids = generate(bundle.model, torch.tensor([bundle.tokenizer.encode("the ")]), max_new_tokens=12, temperature=0)
    ours = bundle.tokenizer.decode(ids[0].tolist())  # no end-of-text id given: it may run past the CLI's stop
    assert len(flagged.strip()) > len("the ") and ours.startswith(flagged.strip())
    err = fails(capsys, "generate", runs["gated decoder"], *common, "--activations", "int8")
    assert "int8 activations are for int8 and int4 layers" in err and "--quantize int8" in err


def test_bits_and_group_size_bad_values_are_one_line(runs, capsys) -> None:
    out = str(runs["root"] / "never")
    err = fails(capsys, "quantize", runs["decoder"], "--out", out, "--bits", "3")
    assert "--bits 3: qkv quantizes to 8 bits" in err
    err = fails(capsys, "quantize", runs["decoder"], "--out", out, "--bits", "4", "--group-size", "48")
    assert "group size 48: int4 groups hold 32, 64, 128, 256 weights" in err
    err = fails(capsys, "quantize", runs["decoder"], "--out", out, "--bits", "4", "--group-size", "64")
    assert "has 32 inputs, not a multiple of the group size 64: use --group-size 32" in err
    assert not (runs["root"] / "never").exists()


def test_quantize_to_int8_in_groups_of_32(runs, capsys) -> None:
    out = runs["root"] / "gpt-int8-g32"
    assert main(["quantize", runs["decoder"], "--out", str(out), "--bits", "8", "--group-size", "32"]) == 0
    assert "int8 weights in groups of 32" in capsys.readouterr().err
    info = json.loads((out / QUANTIZATION_FILE).read_text())
    assert info["scheme"] == "int8" and info["int8_group_size"] == 32
    model = load(str(out)).model
    assert all(m.group_size == 32 for m in model.modules() if isinstance(m, Int8Linear))
    reference = quantize_model(copy.deepcopy(load(runs["decoder"]).model), "int8", group_size=32)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), rtol=0, atol=0)
    default = json.loads((runs["root"] / "gpt-int8" / QUANTIZATION_FILE).read_text())  # no --group-size
    assert default["int8_group_size"] == 32  # every width here is a multiple of 32
    per_row = runs["root"] / "gpt-int8-rows"
    assert main(["quantize", runs["decoder"], "--out", str(per_row), "--group-size", "0"]) == 0
    assert "int8 weights with a scale per row" in capsys.readouterr().err
    assert "int8_group_size" not in json.loads((per_row / QUANTIZATION_FILE).read_text())
    assert all(m.weight_scale.dim() == 1 for m in load(str(per_row)).model.modules() if isinstance(m, Int8Linear))
    never = str(runs["root"] / "never-int8")
    err = fails(capsys, "quantize", runs["decoder"], "--out", never, "--group-size", "48")
    assert "int8 group size 48: int8 groups hold a multiple of 32 weights" in err
    err = fails(capsys, "quantize", runs["decoder"], "--out", never, "--bits", "8", "--group-size", "64")
    assert "has 32 inputs, not a multiple of the int8 group size 64: use --group-size 32" in err
    assert not (runs["root"] / "never-int8").exists()


def test_eval_with_int8_weights_is_close_to_float(runs, capsys) -> None:
    exact = json.loads(output(capsys, "eval", runs["decoder"], runs["text"], "--json"))
    int8 = json.loads(output(capsys, "eval", runs["decoder"], runs["text"], "--json", "--quantize", "int8"))
    assert abs(int8["loss"] - exact["loss"]) / exact["loss"] < 0.01
    assert json.loads(output(capsys, "eval", runs["gpt-int8"], runs["text"], "--json")) == int8


def test_translate_and_embed_take_the_flag(runs, capsys) -> None:
    for beam in ("1", "3"):
        lines = output(capsys, "translate", runs["translator"], "the fox", "a baby", "--beam", beam, "--quantize=int8")
        assert len(lines.splitlines()) == 2
    sentences = ["a man eats", "the girl"]
    exact = json.loads(output(capsys, "embed", runs["encoder"], *sentences, "--json"))
    int8 = json.loads(output(capsys, "embed", runs["encoder"], *sentences, "--json", "--quantize", "int8"))
    cosine = torch.nn.functional.cosine_similarity(torch.tensor(exact["embeddings"]), torch.tensor(int8["embeddings"]))
    assert float(cosine.min()) > 0.99


def test_the_server_serves_int8_weights(runs) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from qkv.decoding import generate
    from qkv.server import create_app

    bundle = load(runs["decoder"], quantize="int8")
    with TestClient(create_app(bundle), base_url="http://localhost") as client:  # the server answers localhost names
        response = client.post("/v1/completions", json={"prompt": "the ", "max_tokens": 12, "temperature": 0})
    assert response.status_code == 200, response.text
    ids = bundle.tokenizer.encode("the ")
    expected = generate(bundle.model, ids, max_new_tokens=12, temperature=0)[0, len(ids) :].tolist()
    assert response.json()["choices"][0]["text"] == bundle.tokenizer.decode(expected)


@pytest.mark.parametrize("verb", ["generate", "translate", "embed", "eval", "serve"])
def test_unknown_schemes_are_one_line(runs, capsys, verb) -> None:
    run = {"translate": runs["translator"], "embed": runs["encoder"]}.get(verb, runs["decoder"])
    extra = {"translate": ["a b"], "embed": ["a b"], "eval": [runs["text"]]}.get(verb, [])
    err = fails(capsys, verb, run, *extra, "--quantize", "int3")
    assert "'int3' is not a quantization scheme qkv has: use int8" in err


def test_quantized_folders_cannot_be_trained_exported_or_quantized_again(runs, capsys) -> None:
    q = runs["gpt-int8"]
    err = fails(capsys, "train", "--resume", q)
    assert "holds int8 weights written by `qkv quantize`, which cannot be trained" in err
    err = fails(capsys, "export", q, "--onnx", str(runs["root"] / "q.onnx"))
    assert "holds int8 weights (qkv quantize), which qkv does not export to ONNX" in err
    assert "is quantized already" in fails(capsys, "quantize", q, "--out", str(runs["root"] / "qq"))
    assert "is the model itself" in fails(capsys, "quantize", runs["decoder"], "--out", runs["decoder"])
    assert "is not a quantization scheme" in fails(capsys, "quantize", runs["decoder"], "--out", "x", "--scheme", "fp4")


def test_export_bad_inputs_are_one_line(runs, capsys, tmp_path) -> None:
    assert "--out model.onnx" in fails(capsys, "export", runs["decoder"])
    assert "should end in .onnx" in fails(capsys, "export", runs["decoder"], "--onnx", str(tmp_path / "model.txt"))
    tok = CharTokenizer.train(TEXT)
    short = GPT(GPTConfig(vocab_size=tok.vocab_size, d_model=16, n_heads=2, n_layers=1, context_length=4))
    save_model_dir(tmp_path / "short", short, tok)
    err = fails(capsys, "export", str(tmp_path / "short"), "--onnx", str(tmp_path / "short.onnx"))
    assert "a context of 4 positions is too short to export" in err
    assert not list(tmp_path.glob("*.onnx"))


def test_a_rerun_after_an_interrupted_quantize_cleans_its_own_temporary_files(runs, capsys) -> None:
    out = runs["root"] / "interrupted"
    out.mkdir()
    (out / ".model.safetensors.k3j2.tmp").write_bytes(b"half a file")  # what a kill -9 mid-write leaves
    assert main(["quantize", runs["decoder"], "--out", str(out)]) == 0
    assert "removed 1 unfinished file" in capsys.readouterr().err
    assert not list(out.glob(".*.tmp")) and is_quantized(load(str(out)).model)
    (runs["root"] / "busy").mkdir()
    (runs["root"] / "busy" / "notes.txt").write_text("mine")
    err = fails(capsys, "quantize", runs["decoder"], "--out", str(runs["root"] / "busy"))
    assert "already holds other files (notes.txt)" in err
