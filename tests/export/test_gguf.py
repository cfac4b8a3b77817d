"""qkv export --gguf: small qkv GPTs and Llamas (random weights, qkv's byte-level BPE) written as GGUF, read back
by qkv (logits equal) and by transformers' GGUF loader; refusals in one line; the command line."""

from __future__ import annotations

import pytest
import torch

from qkv.cli import main
from qkv.errors import QkvError
from qkv.export.gguf import export_gguf
from qkv.gguf import read_gguf
from qkv.model_dir import save_model_dir
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, LlamaConfig
from qkv.models.llama import Llama
from qkv.pretrained.gguf import load_gguf
from tests.gguf_files import TEXT, hf_from_gguf, ids_of, logits, need, perturbed

MODELS = {
    "gpt2": lambda v: GPT(
        GPTConfig(vocab_size=v, n_layers=2, d_model=32, n_heads=4, context_length=1024, activation="gelu_tanh")
    ),  # fmt: skip
    "llama": lambda v: Llama(
        LlamaConfig(vocab_size=v, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, context_length=128)
    ),  # fmt: skip
    "qwen2": lambda v: Llama(
        LlamaConfig(
            vocab_size=v,
            n_layers=2,
            d_model=32,
            n_heads=4,
            n_kv_heads=1,
            context_length=128,
            qkv_bias=True,
            tie_embeddings=True,
        )
    ),  # fmt: skip
}


@pytest.mark.parametrize("kind", list(MODELS))
def test_round_trip_f32(tmp_path, bpe, kind):
    need("gguf")
    model = perturbed(MODELS[kind](bpe.vocab_size))
    path = export_gguf(model, bpe, tmp_path / f"{kind}.gguf", gguf_type="f32")
    assert read_gguf(path).architecture == kind
    back = load_gguf(path)
    ids = ids_of(bpe)
    assert torch.equal(logits(back.model, ids), logits(model, ids))
    assert back.tokenizer.encode(TEXT) == bpe.encode(TEXT)
    delta = (logits(hf_from_gguf(path), ids) - logits(model, ids)).abs().max().item()
    assert delta <= 1e-4, delta


def test_f16_rounds_each_weight_once(tmp_path, bpe):
    need("gguf")
    model = perturbed(MODELS["llama"](bpe.vocab_size))
    back = load_gguf(export_gguf(model, bpe, tmp_path / "half.gguf"))  # the default type: f16
    assert read_gguf(tmp_path / "half.gguf").raw("blk.0.attn_q.weight").type == "F16"
    assert read_gguf(tmp_path / "half.gguf").raw("blk.0.attn_norm.weight").type == "F32"
    for name, param in back.model.state_dict().items():
        original = model.state_dict()[name]
        assert torch.allclose(param, original, rtol=2**-11, atol=1e-7), name
    delta = (logits(back.model, ids_of(bpe)) - logits(model, ids_of(bpe))).abs().max().item()
    assert 0 < delta < 0.05, delta


def test_chat_template_and_roles_are_written(tmp_path, bpe):
    need("gguf")
    path = export_gguf(perturbed(MODELS["llama"](bpe.vocab_size)), bpe, tmp_path / "c.gguf", chat_template="{{ x }}")
    meta = read_gguf(path).metadata
    assert meta["tokenizer.chat_template"] == "{{ x }}" and meta["tokenizer.ggml.pre"] == "gpt-2"
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (bpe.bos_id, bpe.eos_id)
    assert meta["tokenizer.ggml.token_type"][:4] == [3, 3, 3, 3] and meta["tokenizer.ggml.add_bos_token"] is False
    assert load_gguf(path).chat_template == "{{ x }}"


def test_refusals_write_nothing(tmp_path, bpe):
    need("gguf")
    encoder = Encoder(EncoderConfig(vocab_size=bpe.vocab_size, d_model=16, n_heads=2, n_layers=1))
    with pytest.raises(QkvError, match="decoder-only language models"):
        export_gguf(encoder, bpe, tmp_path / "e.gguf")
    gelu = GPT(GPTConfig(vocab_size=bpe.vocab_size, d_model=16, n_heads=2, n_layers=1, activation="gelu"))
    with pytest.raises(QkvError, match="exact GELU"):
        export_gguf(gelu, bpe, tmp_path / "g.gguf")
    with pytest.raises(QkvError, match="tokenizer has 300 tokens but the model 301"):
        export_gguf(MODELS["llama"](301), bpe, tmp_path / "v.gguf")
    assert list(tmp_path.iterdir()) == []  # neither the files nor temporary ones


def test_command_line(tmp_path, bpe, capsys):
    need("gguf")
    run = save_model_dir(tmp_path / "run", perturbed(MODELS["llama"](bpe.vocab_size)), bpe)
    out = tmp_path / "model.gguf"
    assert main(["export", str(run), "--gguf", str(out), "--gguf-type", "f32"]) == 0
    assert "wrote" in capsys.readouterr().err
    assert main(["export", str(run), "--gguf", str(out)]) == 2  # exists: --force replaces it
    assert "--force" in capsys.readouterr().err
    assert main(["export", str(run), "--gguf", str(out), "--force"]) == 0
    assert main(["next", "--model", str(out), "To be", "--no-plot"]) == 0  # and every verb reads it
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "run"]


def test_llama3_scaled_rope_round_trip(tmp_path, bpe):
    """Llama 3.1's RoPE scaling goes out as llama.cpp's rope_freqs tensor and comes back as the same rule."""
    need("gguf")
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 64}  # fmt: skip
    config = LlamaConfig(vocab_size=bpe.vocab_size, d_model=64, n_heads=2, n_layers=1, rope_scaling=llama3,
                         rope_base=500000.0, context_length=256)  # fmt: skip
    model = perturbed(Llama(config))
    path = export_gguf(model, bpe, tmp_path / "l3.gguf", gguf_type="f32")
    factors = read_gguf(path).raw("rope_freqs.weight")
    assert factors.type == "F32" and factors.shape == (16,)
    back = load_gguf(path)
    assert back.config.rope_scaling == llama3
    assert torch.equal(logits(back.model, ids_of(bpe)), logits(model, ids_of(bpe)))


def test_without_the_gguf_package(tmp_path, bpe, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "gguf", None)  # as if it were not installed
    with pytest.raises(QkvError, match=r"pip install 'qkv\[gguf\]'"):
        export_gguf(MODELS["llama"](bpe.vocab_size), bpe, tmp_path / "m.gguf")


def test_command_line_refusals(tmp_path, capsys):
    from qkv.tokenizers import WordTokenizer

    need("gguf")
    words = WordTokenizer.train(TEXT)
    run = save_model_dir(tmp_path / "run", MODELS["llama"](words.vocab_size), words)
    for argv, fragment in (
        (["--gguf", str(tmp_path / "w.gguf")], "'word' tokenizer has no GGUF counterpart"),
        (["--gguf", str(tmp_path / "w.gguf"), "--out", str(tmp_path / "w.onnx")], "one export at a time"),
    ):
        assert main(["export", str(run), *argv]) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line and not line.startswith("note:")]
        assert len(lines) == 1 and fragment in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
