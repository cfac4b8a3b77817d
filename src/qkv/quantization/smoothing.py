"""SmoothQuant (Xiao et al., 2023): a linear layer's large input channels moved into its weights before int8
activations round them.

With int8 activations (W8A8) every input vector x of a linear layer is rounded to int8 in blocks of 32, each
on its own step max|x| / 127 (:mod:`qkv.quantization.activation_blocks`): one large channel coarsens the 31
others of its block. For any factors s_j > 0, one per input channel,

    y = x W^T = (x / s) (W diag(s))^T,

so dividing x's channel j by s_j and multiplying W's column j by s_j leaves the float model's output as it was,
while x's large channels shrink; the weights, rounded in groups with scales of their own, take them on. The
factor balances the two ranges,

    s_j = max|x_j|^alpha / max_i |W_ij|^(1 - alpha),    alpha = 0.5 (the paper's),

with max|x_j| read on calibration text and alpha, how much of the range moves, chosen for each input from
:data:`ALPHAS` as the one whose rounded product (x / s in int8 blocks of 32, W s in int8 rows or groups) is
nearest the float product on calibration inputs; 0 (nothing moved) is among them, so smoothing never makes that
error larger. Dividing x by s costs nothing at run time: it is folded into what
writes x,

- a pre-LN block's norm, which writes the input of W_q, W_k and W_v (of W_1 and the gate): gamma / s, beta / s;
- W_v's rows, which write the input of W_o (the heads' outputs are weighted sums of V's rows): rows / s. Query
  heads that share a key/value head (grouped-query attention) read its rows, so they share its factors;
- a gated feed-forward's W_1 (up), which writes silu(gate) * up, the input of W_2: rows / s.

A post-LN block's norm writes the residual stream, not a layer's input, and a plain feed-forward's activation is
not linear, so those inputs are left as they are. The tied unembedding reads the final norm, whose gain is also
the rows of W_E: left too.

    smooth_model(model, calibration)      # then quantize_model(model, "int8", activations="int8")
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor, nn

from qkv.layers.blocks import block_parts
from qkv.layers.feedforward import GatedFeedForward
from qkv.models.family import ENCODER, LANGUAGE_MODEL, family_of
from qkv.quantization.activation_blocks import round_blocks
from qkv.quantization.int8_linear import dequantize, quantize_per_channel, quantize_per_group

ALPHAS = tuple(i / 10 for i in range(11))
"""The strengths tried for each input, every tenth from 0 (nothing moves) to 1 (all of x's range; SmoothQuant's
default is 0.5, AWQ searches such a grid)."""
Progress = Callable[[str, int, int], None]
"""A progress callback: (what is being done, how many of the total are done, the total)."""
SAMPLE_ROWS = 512  # input vectors kept per input to compare the strengths on
WINDOW = 2048  # tokens per calibration window at most (a model's context may be far longer)


@dataclass(frozen=True)
class Fold:
    """Layers that read one input (``readers``) and the module that writes it (``writer``: a norm, whose gain and
    bias are divided by s, or a linear layer, whose output rows are); ``heads`` = (h, h_kv) where the readers read
    h heads of which each group of h / h_kv shares one of the writer's h_kv key/value heads."""

    readers: tuple[Any, ...]  # nn.Linear
    writer: nn.Module
    heads: tuple[int, int] | None = None


def fold_points(model: nn.Module) -> list[Fold]:
    """Every input of ``model``'s linear layers that a factor can be folded into (see the module docstring)."""
    folds: list[Fold] = []
    for block in family_of(model).blocks(model):
        folds += _block_folds(block)
    return [fold for fold in folds if _applies(fold)]


def _applies(fold: Fold) -> bool:
    """Float linear readers, and a writer that is a float linear layer or a norm with a gain."""
    weight = getattr(fold.writer, "weight", None)
    writes = isinstance(fold.writer, nn.Linear) or isinstance(weight, Tensor) and weight.dim() == 1
    return writes and all(isinstance(r, nn.Linear) and r.weight.is_floating_point() for r in fold.readers)


def _block_folds(block: Any) -> list[Fold]:
    folds = []
    for part, around, inner in block_parts(block):
        norm = around.norm if around.norm_first and getattr(around.norm, "weight", None) is not None else None
        if part.kind == "mlp":
            gate = inner.gate if isinstance(inner, GatedFeedForward) else None
            if norm is not None:
                folds.append(Fold((inner.linear1,) if gate is None else (inner.linear1, gate), norm))
            if gate is not None:  # act(gate(x)) * linear1(x): linear in linear1's rows
                folds.append(Fold((inner.linear2,), inner.linear1))
            continue
        if norm is not None:  # self-attention's norm writes Q's, K's and V's input; cross-attention's only Q's
            folds.append(Fold((inner.query, inner.key, inner.value) if part.kind == "attn" else (inner.query,), norm))
        folds.append(Fold((inner.out_proj,), inner.value, (inner.n_heads, inner.n_kv_heads)))
    return folds


def input_maxima(
    model: nn.Module, layers: list[nn.Module], calibration: Callable[[nn.Module], object]
) -> tuple[dict[nn.Module, Tensor], dict[nn.Module, Tensor]]:
    """max |x_j| over every input vector each of ``layers`` reads while ``calibration(model)`` runs, (d_in,) each,
    and up to :data:`SAMPLE_ROWS` of those vectors, spread over the calibration, (n, d_in) each."""
    maxima: dict[nn.Module, Tensor] = {}
    samples: dict[nn.Module, list[Tensor]] = {}

    def record(module: nn.Module, args: tuple) -> None:
        rows = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        x = rows.abs().amax(0)
        maxima[module] = x if module not in maxima else torch.maximum(maxima[module], x)
        step = max(1, rows.shape[0] // 64)  # a few rows of every call, the whole calibration sampled
        samples.setdefault(module, []).append(rows[::step][:64])

    hooks = [layer.register_forward_pre_hook(record) for layer in layers]
    try:
        with torch.no_grad():
            calibration(model.eval())
    finally:
        for hook in hooks:
            hook.remove()
    kept = {}
    for module, parts in samples.items():
        rows = torch.cat(parts)
        kept[module] = rows[torch.linspace(0, rows.shape[0] - 1, min(SAMPLE_ROWS, rows.shape[0])).long()]
    return maxima, kept


def smooth_model(
    model: nn.Module,
    calibration: Callable[[nn.Module], object],
    group_size: int = 32,
    alphas: tuple = ALPHAS,
    progress: Progress | None = None,
) -> dict[str, float]:
    """Fold SmoothQuant's factors into ``model`` (float, in place), its inputs read while ``calibration(model)``
    runs; the model computes what it did, up to float rounding. ``group_size``: the int8 weights' (0: a scale per
    row), which the rounded products of each strength in ``alphas`` use. Returns the strength chosen for each
    input, by the name of its first reader (0: left as it was; none: a post-LN stack, nothing to fold into).
    ``progress("smoothing", done, total)`` is called as the inputs are done (0 of them first)."""
    folds = fold_points(model)
    if progress is not None:
        progress("smoothing", 0, len(folds))
    maxima, samples = input_maxima(model, [fold.readers[0] for fold in folds], calibration)
    names = {module: name for name, module in model.named_modules()}
    chosen = {}
    with torch.no_grad():
        for done, fold in enumerate(reversed(folds)):  # a fold divides its writer's rows: the one before reads them
            if progress is not None and done:
                progress("smoothing", done, len(folds))
            x = maxima.get(fold.readers[0])
            if x is None:  # never reached by the calibration (a cross-attention the feed does not run)
                continue
            w = torch.stack([r.weight.detach().abs().amax(0).float() for r in fold.readers]).amax(0)
            factors = {alpha: _factors(x, w, alpha, fold.heads) for alpha in alphas}  # on the writer's channels
            sample = samples[fold.readers[0]]
            exact = [sample @ r.weight.detach().float().T for r in fold.readers]  # the float products, once
            spread = {alpha: _spread(s, fold.heads) for alpha, s in factors.items()}  # on the readers' inputs
            alpha = min(factors, key=lambda a: _rounding_error(fold, sample, exact, spread[a], group_size))
            chosen[names[fold.readers[0]]] = alpha
            if alpha == 0:
                continue
            for reader in fold.readers:
                reader.weight.mul_(spread[alpha].to(reader.weight.dtype))
            _divide_writer(fold.writer, factors[alpha])
    if progress is not None:
        progress("smoothing", len(folds), len(folds))
    return chosen


def _rounding_error(fold: Fold, x: Tensor, exact: list[Tensor], s: Tensor, group_size: int) -> float:
    """sum over the readers of |round(x / s) round(W s)^T - x W^T|^2 on the sample ``x`` (n, d_in), ``exact``
    holding each reader's x W^T: x in int8 blocks of 32, W s in int8 rows or groups, as W8A8 multiplies them."""
    xq = round_blocks(x / s) if x.shape[-1] % 32 == 0 else x / s
    error = 0.0
    for reader, product in zip(fold.readers, exact, strict=True):
        scaled = reader.weight.detach().float() * s
        q = quantize_per_group(scaled, group_size) if group_size else quantize_per_channel(scaled)
        error += float((xq @ dequantize(*q, dtype=torch.float32).T - product).pow(2).sum())
    return error


def _factors(x: Tensor, w: Tensor, alpha: float, heads: tuple[int, int] | None) -> Tensor:
    """s_j = max|x_j|^alpha / max|W_j|^(1 - alpha), 1 where a channel never carried a value, one per channel the
    writer writes. With ``heads`` (h, h_kv), the channels of the query heads that share a key/value head take that
    group's largest ranges: one factor per key/value channel (h_kv d_k) serves them all."""
    if heads is not None:
        h, h_kv = heads
        x, w = (t.view(h_kv, h // h_kv, -1).amax(1).reshape(-1) for t in (x, w))  # head j reads head j // group
    s = x.clamp(min=1e-5).pow(alpha) / w.clamp(min=1e-5).pow(1 - alpha)
    return torch.where((x > 0) & (w > 0), s, torch.ones_like(s)).clamp(1e-4, 1e4)


def _spread(s: Tensor, heads: tuple[int, int] | None) -> Tensor:
    """The writer's factors on the readers' input channels: with ``heads`` (h, h_kv), each query head takes its
    key/value head's (h d_k of them); else the same."""
    if heads is None:
        return s
    h, h_kv = heads
    return s.view(h_kv, 1, -1).expand(h_kv, h // h_kv, -1).reshape(-1)


def _divide_writer(writer: nn.Module, s: Tensor) -> None:
    """What writes the readers' input, divided by s channel by channel: a norm's gain and bias, or a layer's rows."""
    weight = cast(Tensor, writer.weight)
    if weight.dim() == 1:  # a norm's gain
        weight.div_(s.to(weight.dtype))
    else:
        weight.div_(s.to(weight.dtype)[:, None])
    bias = getattr(writer, "bias", None)
    if isinstance(bias, Tensor):
        bias.div_(s.to(bias.dtype))


def smoothing_feed(bundle: Any, text: str) -> Callable[[nn.Module], object] | None:
    """What :func:`smooth_model` reads the inputs' ranges on, for the model of ``bundle`` (a ModelBundle): ``text``
    (callers without one give :func:`qkv.data.builtin.calibration_sample`), tokenized and cut into windows of the
    model's context (at most :data:`WINDOW` tokens), each run through the model's forward. None where there is
    nothing to run it on: a translator (two vocabularies; its post-LN blocks have little to fold), or no tokens."""
    family = family_of(bundle.model)
    if family.role not in (LANGUAGE_MODEL, ENCODER):
        return None
    ids = torch.tensor(bundle.tokenizer.encode(text), dtype=torch.long)
    if ids.numel() == 0:
        return None
    length = min(family.context_length(bundle.config) or WINDOW, WINDOW)
    windows = list(ids.split(length))

    def feed(model: nn.Module) -> object:
        device = next(model.parameters()).device
        return [model(window[None].to(device)) for window in windows]

    return feed
