"""What goes wrong when loading pretrained models says what and how to fix it; the Hub is never contacted."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qkv.errors import QkvError
from qkv.pretrained import load_pretrained, resolve_model_dir
from qkv.pretrained.loader import ARCHITECTURES


def _copy_with(gpt2_dir: Path, tmp_path: Path, edit_state=None, edit_config=None) -> Path:
    """A copy of the GPT-2 folder with its state dict and/or config.json changed."""
    folder = tmp_path / "edited"
    shutil.copytree(gpt2_dir, folder)
    if edit_state is not None:
        state = load_file(folder / "model.safetensors")
        edit_state(state)
        save_file(state, folder / "model.safetensors")
    if edit_config is not None:
        config = json.loads((folder / "config.json").read_text())
        edit_config(config)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_folder_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(QkvError, match="has no config.json: pass the folder of a Hugging Face model"):
        load_pretrained(tmp_path)


def test_folder_without_weights(gpt2_dir: Path, tmp_path: Path) -> None:
    shutil.copy(gpt2_dir / "config.json", tmp_path)
    with pytest.raises(QkvError, match=r"has no weights \(model.safetensors"):
        load_pretrained(tmp_path)


def test_unknown_model_type(gpt2_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(gpt2_dir, tmp_path, edit_config=lambda c: c.update(model_type="t5"))
    with pytest.raises(QkvError, match=r"'t5' \(GPT2LMHeadModel\) model .* cannot import: qkv reads GPT2LMHeadModel, "):
        load_pretrained(folder)
    assert set(ARCHITECTURES) == {"gpt2", "bert", "marian", "llama", "qwen2", "mistral"}


def test_missing_tensor_is_named(gpt2_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(gpt2_dir, tmp_path, edit_state=lambda s: s.pop("transformer.h.1.mlp.c_fc.bias"))
    with pytest.raises(QkvError) as error:
        load_pretrained(folder)
    message = str(error.value)
    assert "h.1.mlp.c_fc.bias" in message and "decoder.blocks.1.feed_forward.linear1.bias" in message
    assert "[256]" in message


def test_missing_fused_tensor_is_named(gpt2_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(gpt2_dir, tmp_path, edit_state=lambda s: s.pop("transformer.h.0.attn.c_attn.weight"))
    with pytest.raises(QkvError, match=r"lack h\.0\.attn\.c_attn\.weight \(qkv decoder\.blocks\.0\.self_attn\.query"):
        load_pretrained(folder)


def test_shape_mismatch_names_both_tensors_and_shapes(gpt2_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(gpt2_dir, tmp_path, edit_config=lambda c: c.update(n_positions=32))
    with pytest.raises(QkvError) as error:
        load_pretrained(folder)
    message = str(error.value)
    assert "wpe.weight" in message and "embedding.positional_encoding.weight" in message
    assert "[64, 64]" in message and "[32, 64]" in message


def test_fused_tensor_of_wrong_shape(gpt2_dir: Path, tmp_path: Path) -> None:
    def shrink(state: dict[str, torch.Tensor]) -> None:
        state["transformer.h.0.attn.c_attn.weight"] = torch.zeros(64, 100)

    folder = _copy_with(gpt2_dir, tmp_path, edit_state=shrink)
    with pytest.raises(QkvError, match=r"tensor h\.0\.attn\.c_attn\.weight has shape \[64, 100\]"):
        load_pretrained(folder)


def test_unexpected_tensor_is_named(gpt2_dir: Path, tmp_path: Path) -> None:
    def add(state: dict[str, torch.Tensor]) -> None:
        state["transformer.h.0.attn.rotary.inv_freq"] = torch.zeros(8)

    folder = _copy_with(gpt2_dir, tmp_path, edit_state=add)
    with pytest.raises(QkvError, match=r"tensors qkv does not know \(h\.0\.attn\.rotary\.inv_freq\)"):
        load_pretrained(folder)


def test_extra_layer_is_named(gpt2_dir: Path, tmp_path: Path) -> None:
    folder = _copy_with(gpt2_dir, tmp_path, edit_config=lambda c: c.update(n_layer=1))
    with pytest.raises(
        QkvError, match=r"h\.1\.\S+ becomes qkv decoder\.blocks\.1\.\S+, which the model .* does not have"
    ):
        load_pretrained(folder)


def test_untied_output_matrix_that_differs_is_refused(gpt2_dir: Path, tmp_path: Path) -> None:
    def add(state: dict[str, torch.Tensor]) -> None:
        state["lm_head.weight"] = state["transformer.wte.weight"] + 1.0

    folder = _copy_with(gpt2_dir, tmp_path, edit_state=add)
    with pytest.raises(QkvError, match="wte.weight and lm_head.weight differ, but qkv ties"):
        load_pretrained(folder)


def test_missing_path_is_not_sent_to_the_hub(tmp_path: Path) -> None:
    with pytest.raises(QkvError, match="does not exist: check the path"):
        resolve_model_dir(tmp_path / "nowhere")
    with pytest.raises(QkvError, match="does not exist"):
        resolve_model_dir("./not-here")


def test_offline_hub_name_says_how_to_use_a_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def offline(repo_id: str, **kwargs: object) -> str:
        calls.append(repo_id)
        raise LocalEntryNotFoundError("cannot find the requested files in the disk cache and outgoing traffic is off")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)  # no local folder called "gpt2"
    with pytest.raises(QkvError) as error:
        load_pretrained("gpt2")
    message = str(error.value)
    assert "could not reach the Hugging Face Hub for 'gpt2'" in message
    assert "download the model folder elsewhere" in message and "pass its path" in message
    assert calls == ["gpt2"]


def test_unknown_hub_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")

    class RepositoryNotFoundError(Exception):
        pass

    def missing(repo_id: str, **kwargs: object) -> str:
        raise RepositoryNotFoundError("404")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", missing)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(QkvError, match="there is no model 'someone/nothing' on the Hugging Face Hub"):
        load_pretrained("someone/nothing")


def test_hub_download_is_used_when_online(gpt2_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    patterns = []

    def cached(repo_id: str, allow_patterns: list[str]) -> str:
        patterns.append(allow_patterns)
        return str(gpt2_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cached)
    monkeypatch.chdir(tmp_path)
    bundle = load_pretrained("openai-community/gpt2")
    assert bundle.path == gpt2_dir and bundle.config.n_layers == 2
    assert "model.safetensors" in patterns[0] and "pytorch_model.bin" not in patterns[0]  # no needless pickles


def test_without_huggingface_hub_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes `import huggingface_hub` fail
    monkeypatch.chdir(tmp_path)
    with pytest.raises(QkvError, match="pip install huggingface_hub"):
        load_pretrained("gpt2")
