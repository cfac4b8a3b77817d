"""Writing a qkv language model as a GGUF file that llama.cpp runs (``qkv export RUN --gguf model.gguf``).

The model's family writes it (its ``gguf`` module, e.g. :mod:`qkv.models.llama.gguf`): a Llama becomes ``llama``
(or ``qwen2`` when W_q, W_k, W_v have biases), a GPT ``gpt2`` (learned, sinusoidal or no positions) or
``starcoder2`` (rotary positions). The family's module checks that llama.cpp computes what qkv computes,
rewrites the tensors where it must (W_q/W_k rows for llama's RoPE, zero biases, ...) and names the
hyperparameters; the tokenizer becomes ``tokenizer.ggml.*`` (:mod:`qkv.gguf.vocab`), the chat template
``tokenizer.chat_template``. gguf-py's ``GGUFWriter`` (llama.cpp's own writer) lays out the file, written to a
temporary file and renamed.

Matrices are stored as F16 by default (``gguf_type="f32"`` keeps every bit): llama.cpp's converter writes F16
too, its quantizer (llama-quantize) starts from either, and the file is half the size; each weight is then
rounded to 11 significant bits (a relative error of at most 2^-11). Vectors (norms, biases) stay F32, as
llama.cpp writes them. A weight beyond float16's range (65504) is refused with the F32 fix.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.gguf.names import W_U, Row, fill
from qkv.gguf.vocab import tokenizer_metadata
from qkv.io import atomic_write, check_writable
from qkv.models.family import family_of
from qkv.quantization import is_quantized, quantization_scheme
from qkv.storage import unwrap_model
from qkv.tokenizers import Tokenizer

GGUF_TYPES = {"f16": (np.float16, 1), "f32": (np.float32, 0)}
"""--gguf-type -> (numpy type of the matrices, general.file_type: 1 "mostly F16", 0 "all F32")."""
DEFAULT_GGUF_TYPE = "f16"
F16_MAX = 65504.0


def gguf_package() -> ModuleType:
    """gguf-py (llama.cpp's writer), or one line saying how to install it."""
    try:
        return importlib.import_module("gguf")
    except ImportError:
        raise QkvError("writing GGUF needs the gguf package: pip install 'qkv[gguf]' (or pip install gguf)") from None


def gguf_tensors(rows: list[Row], config: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """GGUF name -> tensor, each row's ``to_gguf`` applied to the qkv tensors it names (W_U left out when tied)."""
    out: dict[str, Tensor] = {}
    for row in rows:
        if row.qkv == (W_U,) and config.tie_embeddings:
            continue
        for block in range(config.n_layers) if "{i}" in row.gguf else [None]:
            names = [fill(name, block) for name in row.qkv]
            missing = [name for name in names if name not in state]
            if missing:
                raise RuntimeError(f"the {row.gguf} row needs {missing}, which the model does not have")
            out[fill(row.gguf, block)] = row.to_gguf(*(state[name] for name in names))
    return out


def _arrays(tensors: dict[str, Tensor], gguf_type: str) -> dict[str, np.ndarray]:
    dtype = GGUF_TYPES[gguf_type][0]
    arrays = {}
    for name, tensor in tensors.items():
        array = tensor.detach().float().cpu().contiguous().numpy()
        if array.ndim >= 2 and dtype is np.float16:
            biggest = float(np.abs(array).max(initial=0.0))
            if not biggest <= F16_MAX:
                raise QkvError(f"tensor {name} holds {biggest:g}, beyond float16's range: export with --gguf-type f32")
            array = array.astype(np.float16)
        arrays[name] = array
    return arrays


def _value_type(gguf: ModuleType, value: Any) -> tuple[Any, Any]:
    """GGUF's (value type, element type) for a metadata value: ids and counts uint32, token types int32."""
    kinds = gguf.GGUFValueType
    scalar = {bool: kinds.BOOL, int: kinds.UINT32, float: kinds.FLOAT32, str: kinds.STRING}
    element = {bool: kinds.BOOL, int: kinds.INT32, float: kinds.FLOAT32, str: kinds.STRING}
    if isinstance(value, list):
        return kinds.ARRAY, element[type(value[0])]
    return scalar[type(value)], None


def write_gguf(path: str | Path, arch: str, metadata: dict[str, Any], arrays: dict[str, np.ndarray]) -> Path:
    """Write metadata and tensors with gguf-py's GGUFWriter, atomically (a temporary file, then a rename)."""
    gguf = gguf_package()
    empty = [key for key, value in metadata.items() if isinstance(value, list) and not value]
    if empty:
        raise QkvError(f"{empty[0]} would be an empty list, which GGUF cannot store (a tokenizer without merges?)")

    def write(temporary: str) -> None:
        writer = gguf.GGUFWriter(temporary, arch)
        for key, value in metadata.items():
            writer.add_key_value(key, value, *_value_type(gguf, value))
        for name, array in arrays.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    atomic_write(path, write)
    return Path(path)


def export_gguf(
    model: nn.Module,
    tokenizer: Tokenizer,
    path: str | Path,
    *,
    gguf_type: str = DEFAULT_GGUF_TYPE,
    chat_template: str | None = None,
    name: str | None = None,
    approximate_gelu: bool = False,
) -> Path:
    """Write ``model`` (a qkv GPT or Llama) with ``tokenizer`` as the GGUF file ``path``; return the path.

    Everything GGUF cannot express (the family, a config field, the tokenizer) is refused in one line before
    anything is written. ``approximate_gelu`` accepts llama.cpp's tanh GELU for a GPT trained with the exact one.
    """
    if gguf_type not in GGUF_TYPES:
        raise QkvError(f"--gguf-type {gguf_type!r} is unknown: choose {' or '.join(GGUF_TYPES)}")
    model = unwrap_model(model)
    family = family_of(model)
    if is_quantized(model):
        raise QkvError(
            f"this model holds {quantization_scheme(model)} weights (qkv quantize), which qkv does not write to GGUF: "
            "export the float run it was quantized from (llama.cpp's llama-quantize makes Q8_0 or Q4_K files of it)"
        )
    if family.gguf is None:
        raise QkvError(
            f"this is {family.title}; GGUF (llama.cpp) holds decoder-only language models, and qkv writes its "
            "GPT and Llama models: export this one to ONNX with --out NAME.onnx"
        )
    module = family.gguf
    arch, config, state, extra = module.export(model, approximate_gelu=approximate_gelu)
    vocabulary = tokenizer_metadata(tokenizer)
    if len(vocabulary["tokenizer.ggml.tokens"]) != config.vocab_size:
        raise QkvError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model {config.vocab_size}")
    check_writable(path)
    tensors = gguf_tensors(module.rows(config, arch), config, state)
    arrays = {**_arrays(tensors, gguf_type), **{name: t.numpy() for name, t in extra.items()}}
    metadata: dict[str, Any] = {
        "general.name": name or Path(path).stem,
        "general.file_type": GGUF_TYPES[gguf_type][1],
        **module.metadata(config, arch),
        **vocabulary,
    }
    if chat_template:
        metadata["tokenizer.chat_template"] = chat_template
    return write_gguf(path, arch, metadata, arrays)
