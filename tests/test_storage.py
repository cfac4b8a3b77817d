"""qkv.storage.load_weights: the file's header, tied names and shapes checked against the model, each
problem one QkvError. Files are written with safetensors' own ``save_file``, not with qkv's writer."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from qkv.errors import QkvError
from qkv.storage import load_weights


class Tied(nn.Module):
    """Two linear maps sharing one weight (as tied embeddings do), plus a bias of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 3, bias=False)
        self.second = nn.Linear(3, 3)
        self.second.weight = self.first.weight


def _write(path, tensors: dict[str, torch.Tensor], **metadata: str) -> None:
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(path), metadata=metadata)


def test_a_tied_weight_stored_once_fills_both_names(tmp_path) -> None:
    weight, bias = torch.randn(3, 3), torch.randn(3)
    _write(tmp_path / "w.safetensors", {"first.weight": weight, "second.bias": bias})
    model = load_weights(Tied(), tmp_path / "w.safetensors")
    assert torch.equal(model.first.weight, weight) and torch.equal(model.second.weight, weight)
    assert model.first.weight is model.second.weight  # the tie is kept
    assert torch.equal(model.second.bias, bias)


def test_the_header_alias_names_the_stored_tensor(tmp_path) -> None:
    weight = torch.randn(3, 3)
    tied = json.dumps({"second.weight": "first.weight"})  # left out of the file: its stored name
    _write(tmp_path / "w.safetensors", {"first.weight": weight, "second.bias": torch.zeros(3)}, tied=tied)
    model = Tied()
    model.second.weight = nn.Parameter(torch.zeros(3, 3))  # untied here, as every name is on a meta device
    model = load_weights(model, tmp_path / "w.safetensors")
    assert torch.equal(model.second.weight, weight) and model.second.weight is not model.first.weight


def test_two_different_copies_of_a_tied_weight_are_refused(tmp_path) -> None:
    tensors = {"first.weight": torch.randn(3, 3), "second.weight": torch.randn(3, 3), "second.bias": torch.zeros(3)}
    _write(tmp_path / "w.safetensors", tensors)
    with pytest.raises(QkvError, match="stores different tensors for first.weight and second.weight"):
        load_weights(Tied(), tmp_path / "w.safetensors")


def test_a_wrong_shape_and_a_missing_tensor_are_named(tmp_path) -> None:
    _write(tmp_path / "shape.safetensors", {"first.weight": torch.randn(3, 3), "second.bias": torch.zeros(4)})
    with pytest.raises(QkvError, match=r"tensor second.bias in .* has shape \[4\] but the model expects \[3\]"):
        load_weights(Tied(), tmp_path / "shape.safetensors")
    _write(tmp_path / "missing.safetensors", {"second.bias": torch.zeros(3)})
    with pytest.raises(QkvError, match=r"lacks 2 tensor\(s\) the model needs \(first.weight, second.weight\)"):
        load_weights(Tied(), tmp_path / "missing.safetensors")


def test_a_damaged_tied_entry_and_another_kind_are_refused(tmp_path) -> None:
    tensors = {"first.weight": torch.randn(3, 3), "second.bias": torch.zeros(3)}
    _write(tmp_path / "tied.safetensors", tensors, tied="{not json")
    with pytest.raises(QkvError, match="is damaged or truncated"):
        load_weights(Tied(), tmp_path / "tied.safetensors")
    _write(tmp_path / "kind.safetensors", tensors, format="qkv", model="gpt")
    with pytest.raises(QkvError, match="holds the weights of a gpt model, not of the Tied model"):
        load_weights(Tied(), tmp_path / "kind.safetensors")


def test_the_quantization_scheme_must_match(tmp_path) -> None:
    tensors = {"first.weight": torch.randn(3, 3), "second.bias": torch.zeros(3)}
    _write(tmp_path / "w.safetensors", tensors, format="qkv", model="Tied", quantization="int8")
    with pytest.raises(QkvError, match="holds int8 weights, but quantization.json describes an int4 model"):
        load_weights(Tied(), tmp_path / "w.safetensors", quantization="int4")
    assert load_weights(Tied(), tmp_path / "w.safetensors", quantization="int8") is not None


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_nan_or_inf_is_found_in_any_piece_of_a_large_tensor(monkeypatch, contiguous: bool) -> None:
    import qkv.storage

    monkeypatch.setattr(qkv.storage, "CHECK_NUMBERS", 64)  # many pieces of a small tensor
    for bad, word in ((float("nan"), "NaN"), (float("inf"), "infinite values")):
        tensor = torch.zeros(40, 30) if contiguous else torch.zeros(30, 40).T  # (40, 30) either way
        tensor[39, 29] = bad  # the last piece
        assert qkv.storage.non_finite([("w", tensor)]) == ("w", word)
        tensor[39, 29] = 0.0
        assert qkv.storage.non_finite([("w", tensor)]) is None
