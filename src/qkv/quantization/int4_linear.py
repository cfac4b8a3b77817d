"""Weight-only int4 linear layers: groups of g weights along each row share a scale and a minimum.

A 4-bit weight has 16 levels, too few for one scale per output row (a single large weight would leave the
rest of the row one or two levels). So each row of W is cut into groups of g consecutive weights
(g = 32 by default, 64, 128 or 256 allowed) and each group spans its own range (asymmetric, min/max):

    m = min_j W_j,   s = (max_j W_j - m) / 15,   Q_j = round((W_j - m) / s)  in [0, 15],   W_j ~ s Q_j + m,

an error of at most s / 2 per weight. s and m are stored as float16 (the form of GGUF's Q4_1 blocks, w = d q + m,
so that :meth:`Int4Linear.from_gguf` takes Q4_0 and Q4_1 blocks without a change of number), two nibbles per
byte: byte c of a row holds column 2c in its low four bits and column 2c + 1 in its high four. A matrix costs
4 + 32 / g bits per weight (5 for g = 32): about a sixth of its float32 bytes.

**Kernel.** ``torch.ops.aten._weight_int4pack_mm_for_cpu(A, B, g, SZ)`` multiplies A (M, K) by a matrix
reordered once by ``_convert_weight_to_int4pack_for_cpu`` (from int32 levels 0..15, N a multiple of 16) with
the convention

    W_ij = (Q_ij - 8) S_ig + Z_ig,    SZ[g, i] = (S_ig, Z_ig)  (K / g, N, 2),  in A's dtype,

so a group's zero is Z = m + 8 s. In torch 2.13 its x86 code is vectorised (AVX-512, AVX2) for bfloat16 A
only; float32 and float16 A run a scalar loop about 30 times slower. So :class:`Int4Linear` rounds x to
bfloat16, hands the kernel bfloat16 s and Z, and the kernel returns bfloat16 sums (accumulated in float32):
every output carries x's and the scales' bfloat16 rounding (up to 2^-8 relative each) on top of the weights' own.
The reordered copy is made on first use (:meth:`Int4Linear.packed`), rows padded to a multiple of 16, and kept
while Q, s and m are unchanged: the int4 bytes once more in memory. The kernel dequantizes each group once per
block of 4 input rows, so its time grows with the rows; beyond :data:`KERNEL_ROWS` rows (a prompt) the matrix
is widened to bfloat16 a slice of rows at a time and multiplied by oneDNN's bfloat16 GEMM (where the CPU has
bfloat16 instructions; float32 otherwise). Every other device or dtype (CUDA, float64) takes the plain path:
the dequantized matrix in x's dtype and ``F.linear`` (:func:`reference_product`), which is also what the
tests compare the kernel with. bench/int4_linear.py measures the paths.

**Activations.** By default x stays in floating point (weight-only int4), and the C decode step
(:mod:`qkv.native`) multiplies it by the dequantized weights s Q + m as they are. A layer whose ``activations`` is
``"int8"`` (:func:`~qkv.quantization.set_activations`) first rounds x to int8 in blocks of 32
(:mod:`qkv.quantization.activation_blocks`), as llama.cpp's Q4 x Q8 products do: the C step then multiplies
integer levels by integer levels (AVX-512 VNNI), faster, at the price of x's rounding error (SmolLM2's Q4_1
file agrees with its float32 numbers on fewer next tokens: docs/generation.md has the figures). ``"int8x2"``
rounds x twice (the first rounding's error rounded again): the same integer products, twice as many, and
SmolLM2's next tokens those of its weight-only numbers. A prompt of more than 64 rows with ``"int8"`` takes the C
step's own product (:func:`~qkv.quantization.native_forward.lanes_product`: integer sums exact, the weights in the
16-row layout of :meth:`Int4Linear.lanes`, on a CPU with AVX2 or AVX-512 VNNI), not the widened matrix's GEMM:
fewer bytes and, on AVX2, more products per instruction than float32 FMAs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.layers.fused import ConcatenatedProjections, fuse_linears
from qkv.quantization import native_forward
from qkv.quantization.activation_blocks import ACTIVATION_NOTES, INT8_ACTIVATIONS, round_activations
from qkv.quantization.gguf_blocks import q4_groups

LEVELS = 15  # the top level: 4 bits, 0..15
GROUP_SIZE = 32  # weights per scale and minimum: GGUF's Q4_0 / Q4_1 block
GROUP_SIZES = (32, 64, 128, 256)  # the ones the CPU kernel takes
KERNEL_OFFSET = 8  # the kernel reads a level q as q - 8
KERNEL_ROWS = 64  # input vectors up to which the kernel beats widening to bfloat16 + GEMM (bench/int4_linear.py)
KERNEL_N_MULTIPLE = 16  # the kernel's reorder takes N in multiples of 16 (rows are padded)
PACK_ROWS = 4096  # rows reordered at a time (a multiple of the kernel's 64-row blocks): bounded int32 temporaries
DEQUANTIZE_SLICE = 1 << 22  # weights widened at a time on the dequantizing paths (16 MB of float32)
FLOAT16_MAX = 65504.0
KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # x's dtypes that go through bfloat16 on the CPU


def check_group_size(group_size: int, in_features: int | None = None, where: str = "the layer") -> int:
    """``group_size`` if it is one the kernel takes (and divides ``in_features``, if given), else a QkvError."""
    if group_size not in GROUP_SIZES:
        raise QkvError(
            f"group size {group_size}: int4 groups hold {', '.join(map(str, GROUP_SIZES))} weights; choose one "
            "of those (32, the default, is GGUF's Q4 block)"
        )
    if in_features is not None and in_features % group_size:
        fits = [str(g) for g in GROUP_SIZES if in_features % g == 0]
        fix = f"use --group-size {' or '.join(fits)}" if fits else "quantize to int8 (--bits 8)"
        raise QkvError(f"{where} has {in_features} inputs, not a multiple of the group size {group_size}: {fix}")
    return group_size


def pack_nibbles(levels: Tensor) -> Tensor:
    """Levels 0..15 (N, K) as bytes (N, K / 2): column 2c in the low four bits of byte c, 2c + 1 in the high."""
    levels = levels.to(torch.uint8)
    return (levels[:, 0::2] | (levels[:, 1::2] << 4)).contiguous()


def unpack_nibbles(qweight: Tensor) -> Tensor:
    """The levels (N, K) uint8 of bytes packed by :func:`pack_nibbles` (N, K / 2)."""
    return torch.stack([qweight & 15, qweight >> 4], dim=-1).flatten(-2)


LANE_ROWS = 16  # rows multiplied together, one to a lane, by the C kernels of int8 activations (int4_lanes.h)


def per_lane(t: Tensor, g: int) -> Tensor:
    """(rows, groups) -> (g, groups, 16): each group's values of 16 rows side by side."""
    return t[: g * LANE_ROWS].reshape(g, LANE_ROWS, t.shape[1]).transpose(1, 2)


def lanes_layout(qweight: Tensor, scale: Tensor, minimum: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Q's levels (N, K / 2 bytes), s and m of the first N // 16 * 16 rows repacked 16 rows to a vector (the layout
    decoding/lane_layout.py describes; the rows past the last 16 stay with Q's rows): (g, c, v, r, t) bytes whose
    low nibbles hold row r's levels at positions 8 v + t of block c, the high ones 8 v + 4 + t, a block's positions
    in the order the C code rounds x (its 16 even columns, then its 16 odd ones); s and m (g, groups, 16)."""
    n, k = qweight.shape[0], qweight.shape[1] * 2
    g = n // LANE_ROWS
    rows = g * LANE_ROWS
    levels = unpack_nibbles(qweight[:rows])  # (rows, k): the levels, columns in order
    levels = levels.reshape(rows, k // 32, 16, 2).transpose(-1, -2)  # each block's even columns, then its odd
    levels = levels.reshape(g, LANE_ROWS, k // 32, 4, 2, 4)  # position 8 v + 4 h + t of block c
    packed = (levels[..., 0, :] | (levels[..., 1, :] << 4)).permute(0, 2, 3, 1, 4)  # (g, c, v, r, t)
    return packed.contiguous(), per_lane(scale, g).contiguous(), per_lane(minimum, g).contiguous()


def group_grid(low: Tensor, high: Tensor) -> tuple[Tensor, Tensor]:
    """float16 (s, m) of the 16-level grid from ``low`` up to ``high`` (each (N, groups))."""
    if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
        raise QkvError("the weights hold NaN or infinite values, which int4 cannot store: use a finite model")
    if low.numel() and float(torch.maximum(low.abs(), high.abs()).max()) > FLOAT16_MAX:
        raise QkvError(
            f"weights beyond +-{FLOAT16_MAX:g} do not fit int4's float16 scales and minimums: quantize with --bits 8"
        )
    minimum = low.half()
    scale = ((high - minimum.float()) / LEVELS).half()  # from the stored minimum, so that the top level is high
    return scale, minimum


def round_to_grid(w: Tensor, scale: Tensor, minimum: Tensor) -> Tensor:
    """Nearest levels (float, 0..15) of ``w`` (N, groups, g) on the grids (N, groups); a flat group gets 0."""
    s, m = scale.float()[..., None], minimum.float()[..., None]
    levels = torch.round((w - m) / torch.where(s > 0, s, torch.ones_like(s)))
    return torch.where(s > 0, levels.clamp_(0, LEVELS), torch.zeros_like(levels))


def quantize_groups(weight: Tensor, group_size: int = GROUP_SIZE) -> tuple[Tensor, Tensor, Tensor]:
    """(Q bytes (N, K / 2), s float16 (N, K / g), m float16 (N, K / g)) for ``weight`` (N, K): min/max groups,
    rounded to nearest."""
    n_out, n_in = weight.shape
    check_group_size(group_size, n_in)
    w = weight.detach().float().reshape(n_out, n_in // group_size, group_size)  # (N, groups, g)
    scale, minimum = group_grid(w.amin(dim=-1), w.amax(dim=-1))
    levels = round_to_grid(w, scale, minimum).reshape(n_out, n_in)
    return pack_nibbles(levels), scale, minimum


def dequantize(
    qweight: Tensor, scale: Tensor, minimum: Tensor, dtype: torch.dtype = torch.float32, rows: slice = slice(None)
) -> Tensor:
    """s Q + m as a matrix (N, K) in ``dtype`` (computed in float32 unless float64), of the given rows only."""
    if _native_applies(qweight, scale, minimum, dtype):  # the same numbers in one pass of the C library
        return native_forward.widen_int4(qweight[rows], scale[rows], minimum[rows], dtype)
    q = unpack_nibbles(qweight[rows])  # (n, K)
    n_out, groups = q.shape[0], scale.shape[1]
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    s, m = scale[rows].to(wide)[..., None], minimum[rows].to(wide)[..., None]  # (n, groups, 1)
    w = q.view(n_out, groups, -1).to(wide).mul_(s).add_(m)  # (n, groups, g); in place: no second fresh matrix
    return w.view(n_out, -1).to(dtype)


def _native_applies(qweight: Tensor, scale: Tensor, minimum: Tensor, dtype: torch.dtype) -> bool:
    """Whether the C library widens these weights: float16 grids of an even number of columns each, a float32 or
    bfloat16 result (and what native_forward.available asks)."""
    return (
        dtype in (torch.float32, torch.bfloat16)
        and qweight.dtype == torch.uint8
        and scale.dtype == minimum.dtype == torch.float16
        and scale.shape == minimum.shape
        and scale.dim() == 2
        and scale.shape[1] > 0
        and (qweight.shape[1] * 2) % scale.shape[1] == 0
        and (qweight.shape[1] * 2 // scale.shape[1]) % 2 == 0
        and native_forward.available(qweight, scale, minimum)
    )


def reference_product(
    x: Tensor, qweight: Tensor, scale: Tensor, minimum: Tensor, bias: Tensor | None, dtype: torch.dtype | None = None
) -> Tensor:
    """x W^T + b with W = s Q + m widened to ``dtype`` (default x's) a slice of output rows at a time:
    (..., K) -> (..., N) in x's dtype."""
    dtype = dtype or x.dtype
    n_out, n_in = qweight.shape[0], qweight.shape[1] * 2
    step = max(1, DEQUANTIZE_SLICE // max(n_in, 1))
    xs = x.to(dtype)
    pieces = [
        F.linear(xs, dequantize(qweight, scale, minimum, dtype, slice(i, i + step))) for i in range(0, n_out, step)
    ]
    out = (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)).to(x.dtype)
    return out if bias is None else out + bias.to(x.dtype)


@functools.cache
def kernel_available() -> bool:
    """Whether torch has the CPU int4 kernel and its reorder."""
    ops = torch.ops.aten
    return hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")


@functools.cache
def bfloat16_gemm() -> bool:
    """Whether oneDNN multiplies bfloat16 natively on this CPU (AVX-512 BF16 or AMX), faster than float32."""
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_for_kernel(qweight: Tensor, scale: Tensor, minimum: Tensor) -> tuple[Tensor, Tensor]:
    """The kernel's operands: (the reordered levels (N', K / 2) uint8, SZ (K / g, N', 2) bfloat16), N' = N
    rounded up to a multiple of 16 (padding rows have level 8, scale 0, zero 0: outputs of 0)."""
    n_out = qweight.shape[0]
    pad = -n_out % KERNEL_N_MULTIPLE
    parts = []
    for start in range(0, n_out + pad, PACK_ROWS):
        levels = unpack_nibbles(qweight[start : start + PACK_ROWS]).to(torch.int32)  # (n, K)
        if start + PACK_ROWS >= n_out and pad:
            levels = F.pad(levels, (0, 0, 0, pad), value=KERNEL_OFFSET)
        parts.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.contiguous(), 1))
    s, m = scale.float(), minimum.float()
    zero = m + KERNEL_OFFSET * s  # Z = m + 8 s: (q - 8) s + Z = s q + m
    sz = F.pad(torch.stack([s, zero], dim=-1), (0, 0, 0, 0, 0, pad))  # (N', groups, 2)
    return torch.cat(parts), sz.transpose(0, 1).to(torch.bfloat16).contiguous()


def kernel_product(x: Tensor, packed: Tensor, sz: Tensor, n_out: int, group_size: int, bias: Tensor | None) -> Tensor:
    """x W^T + b on the kernel: x and the sums in bfloat16 (see the module docstring). (..., K) -> (..., N)."""
    a = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()  # (M, K)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(a, packed, group_size, sz)  # (M, N') bfloat16
    y = y[:, :n_out] if y.shape[1] != n_out else y
    y = y.to(x.dtype) if bias is None else torch.add(y, bias).to(x.dtype)
    return y.reshape(*x.shape[:-1], n_out)


def frozen(tensor: Tensor) -> nn.Parameter:
    """A parameter that takes no gradient (integer tensors cannot have one)."""
    return nn.Parameter(tensor, requires_grad=False)


class Int4Linear(nn.Module):
    """A linear layer holding int4 levels ``qweight`` (N, K / 2 bytes), float16 ``weight_scale`` and
    ``weight_min`` (N, K / g) and a bias: W = s Q + m per group of ``group_size`` weights of a row.

    ``weight`` is the dequantized matrix (float32, computed on access). Q, s and m are parameters without
    gradient, like :class:`~qkv.quantization.int8_linear.Int8Linear`'s, and never trained.
    """

    activations = "float"  # or "int8": x rounded to int8 in blocks of 32 first (W4A8); set_activations sets it

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group_size: int = GROUP_SIZE) -> None:
        super().__init__()
        check_group_size(group_size, in_features)
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        groups = in_features // group_size
        self.qweight = frozen(torch.zeros(out_features, in_features // 2, dtype=torch.uint8))
        self.weight_scale = frozen(torch.zeros(out_features, groups, dtype=torch.float16))
        self.weight_min = frozen(torch.zeros(out_features, groups, dtype=torch.float16))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self._packed: tuple[tuple, tuple[Tensor, Tensor]] | None = None  # (key of Q, s, m; the kernel's operands)
        self._lanes: tuple[tuple, tuple[Tensor, Tensor, Tensor]] | None = None  # (key of Q, s, m; lanes_layout's)

    @classmethod
    def from_float(cls, weight: Tensor, bias: Tensor | None = None, group_size: int = GROUP_SIZE) -> Int4Linear:
        """The int4 layer for the float layer with ``weight`` (N, K) and ``bias`` (N,): nearest rounding."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias=bias is not None, group_size=group_size)
        layer.set_groups(*quantize_groups(weight, group_size))
        if bias is not None:
            layer.bias.data = bias.detach().clone()  # type: ignore[union-attr]
        return layer.to(weight.device)

    @classmethod
    def from_gguf(cls, data: object, kind: str, shape: Sequence[int], bias: Tensor | None = None) -> Int4Linear:
        """The layer of a GGUF matrix stored as ``kind`` "Q4_0" or "Q4_1" blocks (``tensor.data``, the raw
        bytes), of ``shape`` (out_features, in_features): groups of 32, the same numbers (see
        :mod:`qkv.quantization.gguf_blocks`)."""
        out_features, in_features = (int(n) for n in shape)
        layer = cls(in_features, out_features, bias=bias is not None, group_size=GROUP_SIZE)
        levels, scale, minimum = q4_groups(data, kind, (out_features, in_features))
        layer.set_groups(pack_nibbles(levels), scale, minimum)
        if bias is not None:
            layer.bias.data = bias.detach().float().clone()  # type: ignore[union-attr]
        return layer

    def set_groups(self, qweight: Tensor, scale: Tensor, minimum: Tensor) -> None:
        """Replace Q (N, K / 2 bytes), s and m (N, K / g) with tensors of those shapes."""
        for name, value in (("qweight", qweight), ("weight_scale", scale), ("weight_min", minimum)):
            current = getattr(self, name)
            if value.shape != current.shape:
                raise ValueError(f"{name} must be {tuple(current.shape)}, not {tuple(value.shape)}")
            current.data = value.to(device=current.device, dtype=current.dtype).contiguous()

    @classmethod
    def cat(cls, layers: Sequence[Int4Linear]) -> Int4Linear:
        """One layer computing ``[l(x) for l in layers]`` concatenated on the last axis (fused W_q, W_k, W_v):
        each row keeps its groups, so the same numbers."""
        first = layers[0]
        if len({(m.in_features, m.group_size, m.bias is None) for m in layers}) > 1:
            raise ValueError("stacked int4 layers need one input width, one group size and all or none with a bias")
        n_out = sum(m.out_features for m in layers)
        stacked = cls(first.in_features, n_out, bias=first.bias is not None, group_size=first.group_size)
        stacked.activations = first.activations
        stacked.set_groups(
            *(torch.cat([getattr(m, n) for m in layers]) for n in ("qweight", "weight_scale", "weight_min"))
        )
        if first.bias is not None:
            stacked.bias.data = torch.cat([m.bias for m in layers])  # type: ignore[union-attr, misc]
        return stacked.to(first.qweight.device)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight matrix s Q + m (N, K) in float32, a new tensor on every access."""
        return dequantize(self.qweight, self.weight_scale, self.weight_min)

    def _key(self) -> tuple:
        """What a copy of Q, s and m is made from: their storage, versions and dtype."""
        q, s, m = self.qweight, self.weight_scale, self.weight_min
        try:
            return (q.data_ptr(), s.data_ptr(), m.data_ptr(), q._version, s._version, m._version, s.dtype)
        except RuntimeError:  # inference tensors keep no version counter (and are never changed in place)
            return (q.data_ptr(), s.data_ptr(), m.data_ptr(), s.dtype)

    def packed(self) -> tuple[Tensor, Tensor]:
        """The kernel's reordered copy of Q and its bfloat16 scales and zeros, made on first use and again
        when Q, s or m change."""
        key = self._key()
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, pack_for_kernel(self.qweight, self.weight_scale, self.weight_min))
        return self._packed[1]

    def lanes(self) -> tuple[Tensor, Tensor, Tensor]:
        """Q, s and m 16 rows to a vector for the C kernels of int8 activations (:func:`lanes_layout`), made on
        first use and again when they change: one copy for the decode step and a prompt's product."""
        key = self._key()
        if self._lanes is None or self._lanes[0] != key:
            self._lanes = (key, lanes_layout(self.qweight, self.weight_scale, self.weight_min))
        return self._lanes[1]

    def forward(self, x: Tensor) -> Tensor:
        if self.activations in INT8_ACTIVATIONS and x.numel():  # W4A8: the product of the rounded x (as the C step's)
            weights = self.qweight, self.weight_scale, self.weight_min
            if self.activations == "int8" and (
                (y := native_forward.lanes_product(x, weights, self.bias, self.group_size, self.lanes)) is not None
            ):  # a prompt, x rounded once: the C step's own product
                return y
            x = round_activations(x, self.activations)
        tensors = (self.qweight, self.weight_scale, self.weight_min)
        if x.device.type != "cpu" or x.dtype not in KERNEL_DTYPES or x.numel() == 0 or torch.compiler.is_compiling():
            return reference_product(x, *tensors, self.bias)  # (..., K) -> (..., N)
        if x.numel() <= KERNEL_ROWS * self.in_features and kernel_available():
            return kernel_product(x, *self.packed(), self.out_features, self.group_size, self.bias)
        return reference_product(x, *tensors, self.bias, torch.bfloat16 if bfloat16_gemm() else torch.float32)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"int4, groups of {self.group_size}{ACTIVATION_NOTES[self.activations]}"
        )


@fuse_linears.register
def _fuse_int4(first: Int4Linear, *others: nn.Module) -> nn.Module:
    """W_q, W_k, W_v (or W_g, W_1) as one stacked int4 layer: each row keeps its groups, so the same numbers."""
    modules = (first, *others)
    if all(type(m) is Int4Linear and m.activations == first.activations for m in modules):
        try:
            return Int4Linear.cat(modules)  # type: ignore[arg-type]
        except ValueError:
            pass
    return ConcatenatedProjections(modules)
