"""Exports over existing files: refused without --force; with it, replaced whole, and an encoder and a decoder
of two different exports are never run together."""

from __future__ import annotations

import shutil

import onnx
import pytest

from qkv.errors import QkvError
from qkv.export.onnx import export_onnx
from qkv.export.onnx_runtime import OnnxTranslator

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


def _export_id(path) -> str:
    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}["qkv.export"]


def test_an_existing_file_is_refused_without_overwrite(gpt_onnx, tmp_path) -> None:
    target = tmp_path / "gpt.onnx"
    target.write_bytes(b"keep me")
    with pytest.raises(QkvError, match="gpt.onnx already exists: add --force to replace it"):
        export_onnx(gpt_onnx.bundle.model, target)
    assert target.read_bytes() == b"keep me"


def test_a_translator_pair_shares_one_export_id_and_a_mixed_pair_is_refused(translator_onnx, tmp_path) -> None:
    for file in translator_onnx.files:
        shutil.copy(file, tmp_path / file.name)
    encoder, decoder = tmp_path / "translator.encoder.onnx", tmp_path / "translator.decoder.onnx"
    first = _export_id(encoder)
    assert _export_id(decoder) == first
    old_decoder = decoder.read_bytes()
    with pytest.raises(QkvError, match="already exists"):
        export_onnx(translator_onnx.bundle.model, tmp_path / "translator.onnx")
    written = export_onnx(translator_onnx.bundle.model, tmp_path / "translator.onnx", overwrite=True)
    assert written == [encoder, decoder] and _export_id(encoder) == _export_id(decoder) != first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([encoder.name, decoder.name])  # no work folder left
    OnnxTranslator(encoder)  # a matching pair loads
    decoder.write_bytes(old_decoder)  # as a kill between the two renames of a re-export would leave them
    with pytest.raises(QkvError, match="come from two different exports"):
        OnnxTranslator(encoder)
