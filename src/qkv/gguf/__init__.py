"""GGUF, llama.cpp's file format, in and out.

>>> from qkv.gguf import load_gguf, read_gguf, export_gguf
>>> bundle = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # or qkv.load(it), or --model it  # doctest: +SKIP
>>> bundle.model, bundle.tokenizer, bundle.chat_template    # a float32 qkv Llama, ...  # doctest: +SKIP
>>> raw = read_gguf("model.gguf").raw("blk.0.attn_q.weight")  # blocks as stored  # doctest: +SKIP
>>> raw.type, raw.shape, raw.blocks.shape                   # "Q4_1", (576, 576), (10368, 20)  # doctest: +SKIP
>>> export_gguf(model, tokenizer, "model.gguf")             # `qkv export RUN --gguf FILE`  # doctest: +SKIP

Reading (:mod:`~qkv.gguf.reader`, :mod:`~qkv.gguf.dequantize`, :mod:`~qkv.gguf.loader`, :mod:`~qkv.gguf.tokenizer`)
needs no extra package; writing (:mod:`~qkv.gguf.writer`, :mod:`~qkv.gguf.vocab`) uses gguf-py, llama.cpp's own
writer (``pip install 'qkv[gguf]'``). One module per llama.cpp architecture holds its name table:
:mod:`~qkv.gguf.llama` (llama, qwen2), :mod:`~qkv.gguf.gpt2`, :mod:`~qkv.gguf.starcoder2`.
"""

from qkv.gguf.dequantize import DEQUANTIZERS, dequantize
from qkv.gguf.loader import ARCHITECTURES, load_gguf
from qkv.gguf.reader import GGUFFile, RawTensor, is_gguf_file, read_gguf
from qkv.gguf.writer import DEFAULT_GGUF_TYPE, GGUF_TYPES, export_gguf

__all__ = [
    "ARCHITECTURES",
    "DEFAULT_GGUF_TYPE",
    "DEQUANTIZERS",
    "GGUF_TYPES",
    "GGUFFile",
    "RawTensor",
    "dequantize",
    "export_gguf",
    "is_gguf_file",
    "load_gguf",
    "read_gguf",
]
