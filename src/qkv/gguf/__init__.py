"""GGUF, llama.cpp's file format: the file, its quantized blocks, its names and its tokenizer.

>>> from qkv.gguf import read_gguf, dequantize
>>> file = read_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")      # the header, the metadata, the tensors' places
>>> raw = file.raw("blk.0.attn_q.weight")                     # blocks as stored  # doctest: +SKIP
>>> raw.type, raw.shape, raw.blocks.shape                     # "Q4_1", (576, 576), (10368, 20)  # doctest: +SKIP
>>> dequantize(raw)                                           # float32, as llama.cpp computes it  # doctest: +SKIP

This package knows the format only: :mod:`~qkv.gguf.reader` (the file), :mod:`~qkv.gguf.dequantize` (one function
per tensor type), :mod:`~qkv.gguf.names` and :mod:`~qkv.gguf.metadata` (what a name table and the hyperparameters
are made of), :mod:`~qkv.gguf.rope`, :mod:`~qkv.gguf.tokenizer` and :mod:`~qkv.gguf.vocab` (the tokenizer in and
out). Each model family holds its own name table in its folder (:mod:`qkv.models.llama.gguf`: llama, qwen2;
:mod:`qkv.models.gpt.gguf`: gpt2, starcoder2). Opening a file as a model is :func:`qkv.load` (through
:func:`qkv.pretrained.gguf.load_gguf`); writing one is ``qkv export RUN --gguf FILE``
(:func:`qkv.export.gguf.export_gguf`, with gguf-py: ``pip install 'qkv[gguf]'``).
"""

from qkv.gguf.dequantize import DEQUANTIZERS, dequantize
from qkv.gguf.reader import GGUFFile, RawTensor, is_gguf_file, read_gguf

__all__ = ["DEQUANTIZERS", "GGUFFile", "RawTensor", "dequantize", "is_gguf_file", "read_gguf"]
