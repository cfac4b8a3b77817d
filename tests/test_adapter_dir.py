"""A LoRA adapter folder in PEFT's layout: one that PEFT itself saved opens in qkv (qkv.load: the base it names,
the adapters applied) with PEFT's logits, and what qkv cannot apply is refused with one line."""

from __future__ import annotations

import json

import pytest
import torch

import qkv
from qkv.adapter_dir import ADAPTER_CONFIG_FILE, read_adapter_config
from qkv.errors import QkvError

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def peft_adapter(tmp_path_factory, tiny_llama_dir):
    """An adapter saved by PEFT (q_proj and down_proj, B drawn at random) and the PEFT model it came from."""
    base = transformers.LlamaForCausalLM.from_pretrained(tiny_llama_dir)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    folder = tmp_path_factory.mktemp("peft-adapter")
    model.save_pretrained(folder)
    return folder, model.eval()


def test_an_adapter_saved_by_peft_opens_with_peft_logits(peft_adapter) -> None:
    folder, reference = peft_adapter
    bundle = qkv.load(folder)
    ids = torch.randint(0, bundle.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(ids), reference(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    merged = qkv.load(folder, merge_adapters=True)
    with torch.no_grad():
        torch.testing.assert_close(merged.model(ids), reference(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank_pattern": {"q_proj": 8}}, "their own rank or alpha (rank_pattern)"),
        ({"use_dora": True}, "DoRA or rsLoRA adapter"),
        ({"peft_type": "IA3"}, "is a IA3 adapter, not LoRA"),
        ({"base_model_name_or_path": None}, "names no base model"),
        ({"base_model_name_or_path": "/nowhere/model"}, "/nowhere/model (adapter_config.json's base_model_name"),
        ({"r": 0}, "the LoRA rank must be a positive whole number"),
    ],
)
def test_what_qkv_cannot_apply_is_one_line(peft_adapter, tmp_path, change, message) -> None:
    folder, _ = peft_adapter
    config = json.loads((folder / ADAPTER_CONFIG_FILE).read_text())
    (tmp_path / ADAPTER_CONFIG_FILE).write_text(json.dumps({**config, **change}))
    (tmp_path / "adapter_model.safetensors").write_bytes((folder / "adapter_model.safetensors").read_bytes())
    with pytest.raises(QkvError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        qkv.load(tmp_path)
    assert "\n" not in str(error.value)


def test_a_relative_base_is_found_beside_the_adapter(peft_adapter, tmp_path, tiny_llama_dir) -> None:
    folder, _ = peft_adapter
    config = json.loads((folder / ADAPTER_CONFIG_FILE).read_text())
    (tmp_path / "the-base").symlink_to(tiny_llama_dir, target_is_directory=True)
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / ADAPTER_CONFIG_FILE).write_text(
        json.dumps({**config, "base_model_name_or_path": "../the-base"})
    )
    assert read_adapter_config(tmp_path / "adapter").settings.rank == 4
    (tmp_path / "adapter" / "adapter_model.safetensors").write_bytes(
        (folder / "adapter_model.safetensors").read_bytes()
    )
    assert qkv.load(tmp_path / "adapter").config.n_layers == 2
