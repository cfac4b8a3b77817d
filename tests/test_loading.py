"""qkv.load, the one way to open a model: a run folder (or only its latest checkpoint), a quantized folder, a
Hugging Face folder, a Hub name; Translator.load opens the same things and refuses what is not a translator."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import qkv
from qkv.decoding.translator import Translator
from qkv.errors import QkvError
from qkv.loading import load
from qkv.model_dir import save_model_dir
from qkv.models import GPT, GPTConfig
from qkv.models.family import TRANSLATOR, family_of
from qkv.quantization import is_quantized, quantization_scheme, quantize_model
from qkv.tokenizers import train_tokenizer
from qkv.training.checkpoint import save_training_checkpoint
from tests.pretrained.conftest import gpt2_dir, marian_dir  # noqa: F401  (session fixtures, built once)

TEXT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture
def tokenizer():
    return train_tokenizer("char", TEXT)


@pytest.fixture
def gpt(tokenizer) -> GPT:
    config = GPTConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=2, n_layers=2, context_length=16)
    return GPT(config)


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_qkv_load_is_the_library_entry_point_and_import_qkv_stays_light() -> None:
    assert qkv.load is load
    code = "import sys, qkv; print('qkv.loading' in sys.modules, 'qkv.pretrained' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]  # qkv.load is imported on first use


def test_a_run_folder(tmp_path, tokenizer, gpt) -> None:
    save_model_dir(tmp_path / "run", gpt, tokenizer)
    bundle = load(tmp_path / "run")
    assert family_of(bundle.model) is family_of(gpt) and not bundle.model.training and same_weights(bundle.model, gpt)
    assert bundle.tokenizer.encode(TEXT) == tokenizer.encode(TEXT) and bundle.path == tmp_path / "run"


def test_a_run_with_only_a_checkpoint_opens_the_latest(tmp_path, tokenizer, gpt, capsys) -> None:
    run = tmp_path / "run"
    save_model_dir(run, gpt, tokenizer, weights_name=None)  # a run that has only begun
    for step in (1, 2):
        with torch.no_grad():
            gpt.unembedding.weight.add_(1.0)
        save_training_checkpoint(run, step=step, model=gpt, optimizer=None, trainer_state={})
    bundle = load(str(run))
    assert same_weights(bundle.model, gpt)  # step 2's weights
    assert "no best model yet; using the latest checkpoint step-000002" in capsys.readouterr().err


def test_a_quantized_folder_and_quantizing_as_it_loads(tmp_path, tokenizer, gpt) -> None:
    save_model_dir(tmp_path / "float", gpt, tokenizer)
    quantized = quantize_model(load(tmp_path / "float").model)
    save_model_dir(tmp_path / "int8", quantized, tokenizer)
    bundle = load(tmp_path / "int8")
    assert is_quantized(bundle.model) and same_weights(bundle.model, quantized)
    assert is_quantized(load(tmp_path / "float", quantize="int8").model)
    assert quantization_scheme(load(tmp_path / "float", quantize="int4").model) == "int4"
    with pytest.raises(QkvError, match="'int3' is not a quantization scheme"):
        load(tmp_path / "float", quantize="int3")
    rows = load(tmp_path / "float", quantize="int8", group_size=0).model.decoder.blocks[0].self_attn.query
    groups = load(tmp_path / "float", quantize="int8").model.decoder.blocks[0].self_attn.query
    assert (rows.group_size, groups.group_size) == (0, 32) and rows.weight_scale.shape == (32,)
    with pytest.raises(QkvError, match="group_size=32 is for quantizing on load: add quantize="):
        load(tmp_path / "float", group_size=32)
    with pytest.raises(QkvError, match="int8 group size 20"):
        load(tmp_path / "float", quantize="int8", group_size=20)


def test_activations_set_every_int8_and_int4_layer_and_need_one(tmp_path, tokenizer, gpt) -> None:
    from qkv.quantization import Int4Linear, Int8Linear

    save_model_dir(tmp_path / "float", gpt, tokenizer)
    model = load(tmp_path / "float", quantize="int4", activations="int8").model
    layers = {name: m for name, m in model.named_modules() if isinstance(m, (Int4Linear, Int8Linear))}
    assert {type(m) for m in layers.values()} == {Int4Linear, Int8Linear}
    twice = ("linear2", "unembedding")  # W_2 and W_U round x twice under "int8" (qkv.quantization.activation_modes)
    assert {name: m.activations for name, m in layers.items()} == {
        name: "int8x2" if name.endswith(twice) else "int8" for name in layers
    }
    ids = torch.tensor([tokenizer.encode(TEXT)[:8]])
    with torch.no_grad():  # the rounding reaches the numbers
        assert not torch.equal(model(ids), load(tmp_path / "float", quantize="int4").model(ids))
    assert load(tmp_path / "float", activations="float").model is not None  # float on a float model: nothing to do
    with pytest.raises(QkvError, match="int8 activations are for int8 and int4 layers"):
        load(tmp_path / "float", activations="int8")
    with pytest.raises(QkvError, match="int8x2 activations are for int8 and int4 layers"):
        load(tmp_path / "float", activations="int8x2")
    twice = load(tmp_path / "float", quantize="int4", activations="int8x2").model
    assert {m.activations for m in twice.modules() if isinstance(m, (Int4Linear, Int8Linear))} == {"int8x2"}
    with pytest.raises(QkvError, match="activations 'int4': choose float"):
        load(tmp_path / "missing", activations="int4")  # the value first, before the path


def test_a_hugging_face_folder(gpt2_dir) -> None:  # noqa: F811
    bundle = load(gpt2_dir)
    model_type = json.loads((gpt2_dir / "config.json").read_text())["model_type"]  # "gpt2"
    assert model_type in family_of(bundle.model).hf_model_types and bundle.path == gpt2_dir
    assert bundle.tokenizer.decode(bundle.tokenizer.encode("The quick brown fox")) == "The quick brown fox"


def test_a_hub_name_offline_is_one_line(tmp_path, monkeypatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id: str, **kwargs: object) -> str:
        raise LocalEntryNotFoundError("outgoing traffic has been disabled")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)  # no local folder called "gpt2"
    with pytest.raises(QkvError) as error:
        load("gpt2")
    message = str(error.value)
    assert "\n" not in message and "could not reach the Hugging Face Hub for 'gpt2'" in message


def test_a_missing_path_is_not_sent_to_the_hub(tmp_path) -> None:
    with pytest.raises(QkvError, match="does not exist: check the path"):
        load(tmp_path / "nowhere")
    with pytest.raises(QkvError, match="does not exist"):
        load("./runs/nowhere")


def test_translator_load_opens_a_marian_folder(marian_dir) -> None:  # noqa: F811
    translator = Translator.load(marian_dir[0])
    assert family_of(translator.model).role == TRANSLATOR
    sentences = ["the cat sat on the mat", "hello world"]
    assert translator.translate(sentences, beam=1) == Translator.from_bundle(load(marian_dir[0])).translate(
        sentences, beam=1
    )


def test_translator_load_refuses_a_language_model(tmp_path, tokenizer, gpt) -> None:
    save_model_dir(tmp_path / "lm", gpt, tokenizer)
    with pytest.raises(QkvError) as error:
        Translator.load(tmp_path / "lm")
    assert str(error.value) == (
        f"translating with {tmp_path / 'lm'} needs a translator, and this is a GPT language model (decoder only): "
        "use `qkv generate` with it"
    )
