"""Exporting qkv models to run elsewhere: ONNX graphs (:mod:`qkv.export.onnx`) and the loops that run them
with ONNX Runtime (:mod:`qkv.export.onnx_runtime`)."""

from qkv.export.onnx import export_onnx

__all__ = ["export_onnx"]
