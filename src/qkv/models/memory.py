"""The memory a model needs, worked out before anything is allocated, so that a size the machine cannot hold
is refused with the figure (a QkvError) instead of failing deep inside the allocator.

- Parameters are counted on PyTorch's ``meta`` device (shapes, no storage). Every block of a stack has the
  same parameters, so a model is built with one and with two blocks per stack and the count extrapolated:
  a config with 100,000 layers costs no time.
- Using a model needs its float32 weights: 4 bytes per parameter.
- Training needs per parameter the weight, its gradient and two optimizer moments (AdamW's m and v; Muon
  keeps fewer): 16 bytes. Activations kept for the backward pass, per token of the batch, in float32: per
  block about ``14 d_model + 2 h_kv d_k + 2 d_ff + 3 h n`` numbers (the inputs of the projections, norms and
  feed-forward, and the attention probabilities over the n positions of the context), plus ``3 V`` for
  the logits, their softmax and its gradient. These are lower bounds: what is refused surely does not fit.
  Grouped-query attention keeps keys and values of width h_kv d_k instead of d_model; a gated feed-forward
  keeps four d_ff-wide tensors (W_g x, its activation, W_1 x, their product) instead of two.
- Generating keeps a KV cache: per token, a key and a value of h_kv d_k numbers in every decoder layer
  (:func:`kv_cache_bytes_per_token`), so grouped-query attention shrinks it by h_kv / h.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from torch.overrides import TorchFunctionMode

from qkv.errors import QkvError
from qkv.models.config import BlockSizes

GIB = 2**30


class _ShapesOnly(TorchFunctionMode):
    """torch.nn.init's fills of meta tensors left out: a meta tensor has no values to fill, and PyTorch runs them
    through its Python references, whose first call imports Dynamo (seconds added to a command that only counts).
    Everything else runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        first = args[0] if args else (kwargs or {}).get("tensor")
        if getattr(func, "__module__", None) == "torch.nn.init" and isinstance(first, torch.Tensor) and first.is_meta:
            return first
        return func(*args, **(kwargs or {}))


def parameter_count(config) -> int:
    """Parameters of the model ``config`` describes, counted without allocating them."""
    return model_numbers(config)[0]


def model_numbers(config) -> tuple[int, int]:
    """(parameters, numbers held in buffers such as RoPE's cos/sin tables) of the model ``config`` describes,
    counted without allocating them."""
    from qkv.models.family import build_model, family_of

    stacks = family_of(config).layer_fields

    def count(**layers: int) -> tuple[int, int]:
        try:
            with _ShapesOnly(), torch.device("meta"):
                model = build_model(dataclasses.replace(config, **layers))
        except RuntimeError as error:  # a tensor of more than 2^63 bytes
            raise QkvError(f"this model does not fit any machine ({error}): use smaller sizes") from None
        return sum(p.numel() for p in model.parameters()), sum(b.numel() for b in model.buffers())

    ones = dict.fromkeys(stacks, 1)
    base = count(**ones)
    params, buffers = base
    for name in stacks:  # each stack's per-block numbers, times its extra blocks
        two = count(**{**ones, name: 2})
        params += (two[0] - base[0]) * (getattr(config, name) - 1)
        buffers += (two[1] - base[1]) * (getattr(config, name) - 1)
    return params, buffers


def available_memory(device: torch.device | str) -> int | None:
    """Bytes free for a new allocation on ``device``: the GPU's free memory, or the machine's available RAM
    (None where it cannot be read, e.g. Apple's MPS)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def activation_numbers(config, batch_size: int, length: int | None = None) -> int:
    """Numbers kept for the backward pass of one batch of ``length``-token sequences (default: the whole
    context, as training feeds it; a lower bound, see the module docstring)."""
    from qkv.models.family import family_of

    family = family_of(config)
    d_model = family.model_width(config)
    sizes = config.block_sizes() or BlockSizes(4 * d_model, d_model, 1, False)  # RNNSearch: as wide blocks would be
    length = (family.context_length(config) or 1) if length is None else length
    blocks = sum(getattr(config, name) for name in family.layer_fields) or 1
    vocab = getattr(config, family.vocab_fields[-1])  # the output's vocabulary: a translator's target one
    block = 14 * d_model + 2 * sizes.kv_dim + (4 if sizes.gated else 2) * sizes.d_ff + 3 * sizes.heads * length
    per_token = blocks * block + 3 * vocab
    return batch_size * length * per_token


def check_fits(config, device: torch.device | str, *, batch_size: int | None = None) -> None:
    """QkvError when the model (and, for training, a batch of ``batch_size`` sequences) cannot fit in the
    memory ``device`` has available; the message gives both figures and what to lower."""
    free = available_memory(device)
    if free is None:
        return
    params, buffers = model_numbers(config)
    if batch_size is None:
        need, what = 4 * (params + buffers), f"its {params:,} parameters need {4 * params / GIB:.1f} GiB"
        if buffers * 4 > GIB:  # RoPE's tables for a context of 10^12 positions, say
            what += f" and its tables of {buffers:,} numbers (positions x head size) {4 * buffers / GIB:.1f} GiB"
        fix = "use a smaller model, or a machine (or --device) with more memory"
    else:
        weights, activations = 16 * params, 4 * activation_numbers(config, batch_size)
        need = weights + activations + 4 * buffers
        what = (
            f"training it needs at least {need / GIB:.1f} GiB ({params:,} parameters with gradients and optimizer "
            f"state: {weights / GIB:.1f} GiB; activations of a batch of {batch_size}: {activations / GIB:.1f} GiB)"
        )
        fix = "lower --batch-size (raise --grad-accum to keep the batch), --context-length or the model size"
    if need > free:
        raise QkvError(f"this model does not fit: {what}, but {device} has {free / GIB:.1f} GiB available: {fix}")


def kv_cache_bytes_per_token(config, dtype: torch.dtype = torch.float32) -> int:
    """Bytes the self-attention KV cache holds per generated token of one sequence: a key and a value of
    n_kv_heads * d_k numbers in each decoder layer, 2 L h_kv d_k numbers (2 L d_model without grouped-query
    attention). An encoder keeps no cache (0); a translator's cross-attention keys, computed once per source
    sentence, are not counted."""
    from qkv.models.family import family_of

    family = family_of(config)
    if family.cached_layers is None:  # no decoder that generates over a cache
        return 0
    layers = getattr(config, family.cached_layers)  # a GPT's n_layers, a translator's n_decoder_layers
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * config.kv_dim * element


def check_kv_pool(
    config, slots: int, length: int, dtype: torch.dtype, device: torch.device | str, *,
    fix: str = "decode fewer sequences at once",
) -> None:  # fmt: skip
    """QkvError with the figures when a KV cache pool of ``slots`` rows of ``length`` positions (keys and values of
    every decoder layer, :func:`kv_cache_bytes_per_token`) needs more memory than ``device`` has available."""
    need = slots * length * kv_cache_bytes_per_token(config, dtype)
    free = available_memory(device)
    if free is not None and need > free:
        raise QkvError(
            f"the KV cache for {slots:,} sequences of {length:,} positions needs {need / GIB:,.1f} GiB, but "
            f"{device} has {free / GIB:.1f} GiB available: {fix}"
        )


TOKEN_BYTES = 64
"""Bytes each generated token costs the caller, about: its id and its text, kept until the generation ends."""


def new_tokens_error(new: int) -> QkvError | None:
    """A QkvError when ``new`` generated tokens (their ids and text) could not be held in the memory available
    (``max_new_tokens`` of 10^12: it would run for years and end in the allocator); None when they fit."""
    free = available_memory("cpu")
    if free is None or new * TOKEN_BYTES <= free:
        return None
    return QkvError(
        f"max_new_tokens={new:,} is more tokens than memory holds (about {new * TOKEN_BYTES / GIB:,.0f} GiB of ids "
        f"and text; {free / GIB:.1f} GiB available): ask for at most {free // TOKEN_BYTES:,}; a text that should "
        "run until it ends needs an end token or a stop string"
    )
