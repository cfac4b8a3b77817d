"""GGUF matrices kept quantized as they load: Q4_0, Q4_1 and Q4_K as qkv int4 layers, Q8_0 as int8.

A GGUF file's matrices are mostly blocks of 4 or 8 bits (:mod:`qkv.quantization.gguf_blocks`). Dequantized to
float32 they take 6 to 8 times the file's memory, and decoding reads every one of them for every token; kept
as qkv's quantized layers they keep the file's size and run on qkv's int4 and int8 kernels:

| GGUF type | qkv layer | the numbers |
| --- | --- | --- |
| Q4_0, Q4_1 | :class:`~qkv.quantization.int4_linear.Int4Linear`, groups of 32 | exactly the file's |
| Q4_K | the same | the file's levels; each group's scale and minimum rounded to float16 |
| Q8_0 | :class:`~qkv.quantization.int8_linear.Int8Linear`, groups of 32 | exactly the file's |
| F32, F16, BF16, Q5_K, Q6_K | float32 (dequantized) | exactly the file's |

Q5_K and Q6_K hold more than 4 bits, so int4 would lose what they keep; they stay float. Q8_0 keeps its scale
per 32 weights (an int8 layer with ``group_size`` 32, its float16 scales widened to float32). A token embedding
tied to the unembedding (SmolLM2's, Q8_0 in its Q4 files) becomes the grouped int8 unembedding and an
:class:`~qkv.quantization.int8_embedding.Int8TokenEmbedding` reading the same rows, as ``quantize_model`` makes
it; an untied embedding is only looked up, a row per token, and stays float.

``load_gguf(path, dequantize=True)`` (``--dequantize``) turns all of this off: every tensor float32, the exact
numbers of the file, which is how the tests compare logits with transformers.
"""

from __future__ import annotations

import torch
from torch import nn

from qkv.gguf.names import Row
from qkv.gguf.reader import RawTensor
from qkv.layers.embedding import Unembedding
from qkv.quantization.gguf_blocks import INT4_KINDS
from qkv.quantization.int4_linear import Int4Linear
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import Int8Linear

KEPT = (*INT4_KINDS, "Q8_0")  # the GGUF types kept quantized


def _owner(model: nn.Module, target: str) -> tuple[str, nn.Linear | Unembedding] | None:
    """(name, module) of the float linear layer whose weight is ``target``, or None."""
    name, _, leaf = target.rpartition(".")
    module = model.get_submodule(name) if name else model
    return (name, module) if leaf == "weight" and isinstance(module, (nn.Linear, Unembedding)) else None


def _tied(model: nn.Module, weight: torch.Tensor) -> tuple[list[Unembedding], list[nn.Embedding]]:
    """The unembeddings and the token embeddings whose matrix is ``weight``."""
    heads = [m for m in model.modules() if isinstance(m, Unembedding) and m.weight is weight]
    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding) and m.weight is weight]
    return heads, embeddings


def _replace(model: nn.Module, old: nn.Module, new: nn.Module) -> None:
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if child is old:
                setattr(module, child_name, new)


def _layer(data: torch.Tensor, kind: str, old: nn.Linear | Unembedding) -> nn.Module:
    """The int4 or int8 layer of blocks ``data`` (N, bytes per row) replacing ``old`` (it keeps old's bias)."""
    n_out, n_in = old.weight.shape
    if kind == "Q8_0":
        new: Int8Linear | Int4Linear = Int8Linear.from_gguf(data, kind, (n_out, n_in))
    else:
        new = Int4Linear.from_gguf(data, kind, (n_out, n_in))
    new.bias = old.bias  # the same parameter: the file's bias tensor fills it, before or after this one
    return new


def keep_quantized(model: nn.Module, raw: RawTensor, row: Row, targets: list[str]) -> list[nn.Module] | None:
    """Put the quantized layers of GGUF tensor ``raw`` (the qkv parameters ``targets``) into ``model`` in place of
    their float layers; the new layers, or None when the tensor is to be dequantized instead."""
    if raw.type not in KEPT or len(raw.shape) != 2:
        return None
    params = dict(model.named_parameters(remove_duplicate=False))
    owners = [_owner(model, t) for t in targets]
    tied_embeddings: list[nn.Embedding] = []
    if len(targets) == 1 and owners[0] is None and targets[0] in params:  # W_E: kept only when tied to W_U as int8
        heads, tied_embeddings = _tied(model, params[targets[0]])
        if raw.type != "Q8_0" or len(heads) != 1:
            return None
        owners = [("", heads[0])]
    found = [owner for owner in owners if owner is not None]
    if len(found) < len(owners):
        return None
    data = torch.from_numpy(raw.blocks.copy()).view(raw.shape[0], -1)  # (N, bytes per row): row order is block order
    parts = row.to_qkv(data)  # W_q's rows unpermuted, GPT-2's attn_qkv split: whole rows of blocks either way
    layers = []
    for (_, old), part in zip(found, parts, strict=True):
        if part.shape[0] != old.weight.shape[0] or raw.shape[1] != old.weight.shape[1]:
            return None  # the float path's shape check says what is wrong
        new = _layer(part.contiguous(), raw.type, old)
        _replace(model, old, new)
        layers.append(new)
    for embedding in tied_embeddings:
        assert isinstance(layers[0], Int8Linear)  # a tied W_E is kept only for Q8_0
        _replace(model, embedding, Int8TokenEmbedding(layers[0], scale=getattr(embedding, "scale", 1.0)))
    return layers
