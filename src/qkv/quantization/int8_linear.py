"""Weight-only int8 linear layers: y = (x Q^T) * s + b, one int8 matrix Q and one scale per output channel.

Decoding one token reads every weight matrix once to do two FLOPs per weight, so its speed is the speed at
which the matrices stream from memory (see :mod:`qkv.layers.linear`). Stored as int8, a matrix is a quarter of
its float32 bytes. The activations x stay in floating point: only the weights are quantized.

**Quantization** (symmetric, per output channel, absmax). Row i of W holds the weights of output feature i:

    s_i = max_j |W_ij| / 127,    Q_ij = round(W_ij / s_i)  in [-127, 127],    W_ij ~ s_i Q_ij,

with an error of at most s_i / 2 per weight. One scale per row is exact to take out of the dot product:

    y_i = sum_j x_j W_ij + b_i  ~  s_i (sum_j x_j Q_ij) + b_i,

so the product runs on the int8 matrix and the scales touch only the N outputs. Rows quantized this way
can be stacked (W_q, W_k and W_v into one matrix, :meth:`Int8Linear.cat`) without changing a number.

**Groups.** With ``group_size`` g > 0 (a multiple of 32 dividing K) each row has a scale per g consecutive
weights instead, GGUF's Q8_0 for g = 32 (:meth:`Int8Linear.from_gguf` keeps such a file's blocks as they are):

    s_ij' = max_{j in group j'} |W_ij| / 127,    W_ij ~ s_i,j//g Q_ij,    s: (N, K / g),

so one large weight spoils only its group's resolution (docs/deploy.md, "Int8 in groups", has the figures).
The scales no longer come out of the whole dot product, so torch's per-row kernel does not apply: a grouped
layer always multiplies by its weights dequantized a slice of rows at a time.

**Kernels.** On the CPU, ``torch.ops.aten._weight_int8pack_mm(A, Q, s)`` computes ``A Q^T * s`` for a 2-D
A (M, K) and a contiguous int8 Q (N, K) without ever widening Q in memory. In torch 2.13 its x86 kernel is
vectorised (AVX2 / AVX-512) for bfloat16 A only; float32 A runs a scalar loop several times slower than the
float32 product it would replace. Its vector loads also need K to be a multiple of 16 and 16-byte-aligned
rows (it crashes otherwise). So :func:`int8_linear` rounds the few input vectors of a decoding step to
bfloat16 in a fresh (aligned) tensor, passes scales of 1, and applies the float32 scales and the bias to
the output in the one op that also widens the bfloat16 sums (``torch.mul`` / ``torch.addcmul`` promote);
K % 16 != 0 takes the dequantizing path instead.

Why weight-only int8 reads its bytes much slower than a float32 product reads its own: the kernel is bound by
arithmetic, not memory. For every 16 weights it loads, widens int8 to int32 to float, multiplies by the scale
and adds a product (where float32 needs a load and an FMA), and ends every output with a horizontal sum: one
core runs it at about 18 G weights/s on a matrix in cache and ~6 G weights/s streaming SmolLM2's matrices
(bench/int4_linear.py); and around it the bfloat16 copy of x, the module call and the scales cost 10-15
microseconds, a third of a small matrix's product. The int8-activations path below (fbgemm's VNNI kernel)
and the int4 kernel (:mod:`qkv.quantization.int4_linear`) are faster per product.

The kernel tiles A in blocks of 4 rows and streams Q once per block, so for many rows (a prompt, a batch
of sentences) it loses to BLAS (from how many rows on, bench/int8_linear.py measures): beyond
:data:`KERNEL_ROWS` rows, and on every other device (CUDA included), Q is widened to the activations' dtype
in slices of output rows and multiplied with ``F.linear``: the same arithmetic, with bounded temporary memory.

**Int8 activations.** A layer whose ``activations`` is ``"int8"`` quantizes x too, one vector at a time, and
multiplies with the CPU's int8 dot products (:mod:`qkv.quantization.dynamic`): faster at every row count, at
the price of x's rounding error and a packed copy of Q. A grouped layer rounds x as the C decode step does
(:func:`~qkv.quantization.activation_blocks.round_blocks`: int8 in blocks of 32 along K) and multiplies the rounded x by
its dequantized weights, so a prompt and the decode steps after it agree. ``"int8x2"`` rounds x twice, the
first rounding's error rounded again (:func:`~qkv.quantization.activation_blocks.round_activations`), at every
group size: nearly the weight-only product's numbers with int8 dot products. The default, ``"float"``, is the
weight-only product above. The fused rule for :func:`~qkv.layers.fused.fuse_linears` stacks int8 layers with
:meth:`Int8Linear.cat`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from qkv.errors import QkvError
from qkv.layers.fused import ConcatenatedProjections, fuse_linears
from qkv.quantization import dynamic, native_forward
from qkv.quantization.activation_blocks import ACTIVATION_NOTES, INT8_ACTIVATIONS, round_activations
from qkv.quantization.gguf_blocks import q8_0_levels
from qkv.quantization.int4_linear import bfloat16_gemm

Q_MAX = 127  # symmetric int8: -127..127 (-128 is left out so that -Q is representable)
ACTIVATIONS = ("float", *INT8_ACTIVATIONS)  # weight-only, or x rounded to int8 too (W8A8): once or twice
KERNEL_ROWS = 16  # input vectors up to which the CPU int8 kernel beats widening Q and BLAS (bench/int8_linear.py)
KERNEL_K_MULTIPLE = 16  # the kernel's vector loads read 16 weights (AVX-512) at a time, aligned
DEQUANTIZE_SLICE = 1 << 22  # weights widened at a time on the dequantizing path (16 MB of float32)
GROUP_UNIT = 32  # int8 groups hold a multiple of 32 weights (the C step's blocks of x)
Q8_0_GROUP = 32  # GGUF's Q8_0: a float16 scale per 32 weights


def frozen(tensor: Tensor) -> nn.Parameter:
    """A parameter that takes no gradient (int8 tensors cannot have one)."""
    return nn.Parameter(tensor, requires_grad=False)


def check_group_size(group_size: int, in_features: int | None = None, where: str = "the layer") -> int:
    """``group_size`` if an int8 layer takes it (0: a scale per row; else a multiple of 32 dividing
    ``in_features``, if given), else a QkvError."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 0 or group_size % GROUP_UNIT:
        raise QkvError(
            f"int8 group size {group_size}: int8 groups hold a multiple of {GROUP_UNIT} weights (32 is GGUF's Q8_0 "
            "block); use 32, or 0 for one scale per output row"
        )
    if group_size and in_features is not None and in_features % group_size:
        fits = [str(g) for g in range(GROUP_UNIT, min(in_features, 256) + 1, GROUP_UNIT) if in_features % g == 0]
        fix = f"use --group-size {' or '.join(fits)}" if fits else "quantize with one scale per row (no --group-size)"
        raise QkvError(f"{where} has {in_features} inputs, not a multiple of the int8 group size {group_size}: {fix}")
    return group_size


def quantize_per_channel(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(Q int8 (N, K), s float32 (N,)) with W ~ s[:, None] * Q: symmetric absmax per output row.

    A row of zeros gets the scale 1 (and Q = 0), so that no scale is 0 and nothing divides by it.
    """
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / Q_MAX  # (N,)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp_(-Q_MAX, Q_MAX).to(torch.int8)  # (N, K)
    return q.contiguous(), scale


def quantize_per_group(weight: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """(Q int8 (N, K), s float32 (N, K / g)) with W_ij ~ s[i, j // g] Q_ij: symmetric absmax per group of g
    consecutive weights of a row. A group of zeros gets the scale 1 (and Q = 0)."""
    n_out, n_in = weight.shape
    check_group_size(group_size, n_in)
    groups = weight.detach().float().reshape(n_out, n_in // group_size, group_size)  # (N, K / g, g)
    scale = groups.abs().amax(dim=2) / Q_MAX  # (N, K / g)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(groups / scale[..., None]).clamp_(-Q_MAX, Q_MAX).to(torch.int8)
    return q.reshape(n_out, n_in).contiguous(), scale


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """s Q as a float matrix (N, K) in ``dtype`` (default: the scales' dtype): s (N,) one scale per row, or
    s (N, K / g) one per group of g weights (the group size is read from the shapes)."""
    dtype = dtype or scale.dtype
    if scale.dim() == 1:
        return q.to(dtype) * scale.to(dtype)[:, None]
    n_out, n_in = q.shape
    if _native_applies(q, scale, dtype):  # the same numbers in one pass of the C library
        return native_forward.widen_int8(q, scale, dtype)
    groups = q.reshape(n_out, scale.shape[1], -1).float() * scale.float()[..., None]  # (N, K / g, g), float32
    return groups.reshape(n_out, n_in).to(dtype)


def _native_applies(q: Tensor, scale: Tensor, dtype: torch.dtype) -> bool:
    """Whether the C library widens grouped weights: int8 with float32 scales, a float32 or bfloat16 result (and
    what native_forward.available asks)."""
    return (
        q.dtype == torch.int8
        and scale.dtype == torch.float32
        and dtype in (torch.float32, torch.bfloat16)
        and scale.shape[1] > 0
        and q.shape[1] % scale.shape[1] == 0
        and native_forward.available(q, scale)
    )


def kernel_applies(x: Tensor, q: Tensor) -> bool:
    """Whether :func:`int8_linear` multiplies x by Q with torch's CPU int8 kernel (see the module docstring)."""
    n_in = q.shape[1]
    rows = x.numel() // n_in if n_in else 0
    return (
        x.device.type == "cpu"
        and 0 < rows <= KERNEL_ROWS
        and n_in % KERNEL_K_MULTIPLE == 0
        and q.is_contiguous()
        and x.dtype in (torch.float32, torch.bfloat16)
    )


def _dequantized_product(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:
    """x Q^T * s + b with Q widened a slice of output rows at a time. (..., K) -> (..., N).

    Q is widened to x's dtype, except for more than :data:`KERNEL_ROWS` float32 vectors (a prompt) on a CPU with
    bfloat16 products (AVX-512 BF16, AMX): there x and Q go to bfloat16, which holds every int8 level exactly and
    multiplies about twice as fast as float32; as on the kernel path, x is rounded to bfloat16 and the sums come
    back as bfloat16, then scaled in float32. Grouped scales (N, K / g) cannot be applied to the sums: those
    layers multiply x by the dequantized slices s Q (computed in float32), in x's dtype, or for a prompt on such a
    CPU in bfloat16 as the int4 layers do (s Q rounded to bfloat16 too: 2^-9 of each weight at most)."""
    n_out, n_in = q.shape
    step = max(1, DEQUANTIZE_SLICE // max(n_in, 1))
    many = x.numel() > KERNEL_ROWS * n_in and x.dtype == torch.float32 and x.device.type == "cpu"
    wide = torch.bfloat16 if many and bfloat16_gemm() else x.dtype
    if scale.dim() == 2:
        xs = x.to(wide)
        pieces = [F.linear(xs, dequantize(q[start : start + step], scale[start : start + step], wide)).to(x.dtype)
                  for start in range(0, n_out, step)]  # fmt: skip
        y = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)  # (..., N)
        return y if bias is None else y + bias.to(x.dtype)
    xs, scale, bias = x.to(wide), scale.to(x.dtype), None if bias is None else bias.to(x.dtype)
    pieces = []
    for start in range(0, n_out, step):
        part = torch.mul(F.linear(xs, q[start : start + step].to(wide)), scale[start : start + step])  # in x's dtype
        pieces.append(part if bias is None else part + bias[start : start + step])
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)


def int8_linear(x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None = None, ones: Tensor | None = None) -> Tensor:
    """y = (x Q^T) * s + b for x (..., K), int8 Q (N, K), scales s (N,): (..., K) -> (..., N). Scales per group
    s (N, K / g) take the dequantizing path: y = x (s Q)^T + b.

    ``ones`` is a bfloat16 vector of N ones for the kernel's own scales: pass a stored one under torch.compile
    (Inductor cannot lower the kernel with a tensor made inside the graph).
    """
    if scale.dim() == 2 or not kernel_applies(x, q):
        return _dequantized_product(x, q, scale, bias)
    n_out, n_in = q.shape
    # A fresh contiguous bfloat16 copy: the kernel's aligned vector loads need 16-byte-aligned rows. Converting
    # a contiguous float32 x makes one already (the explicit copy costs a microsecond more per call).
    rows = x.reshape(-1, n_in)
    if rows.dtype == torch.float32 and rows.is_contiguous():
        a = rows.to(torch.bfloat16)  # (M, K)
    else:
        a = rows.to(torch.bfloat16, memory_format=torch.contiguous_format, copy=True)
    ones = torch.ones(n_out, dtype=torch.bfloat16) if ones is None else ones  # scales are applied below
    y = torch.ops.aten._weight_int8pack_mm(a, q, ones)  # (M, N) bfloat16
    # One op for the scales (and bias), promoting the bfloat16 sums to the scales' dtype on the way.
    y = torch.mul(y, scale) if bias is None else torch.addcmul(bias, y, scale)
    return y.to(x.dtype).reshape(*x.shape[:-1], n_out)


class Int8Product(torch.autograd.Function):
    """:func:`int8_linear` differentiable in x (and b), keeping nothing but Q and s for the backward pass.

    Autograd through the dequantizing path would keep the widened float copy of Q per layer, the memory that
    quantizing saves; here the backward widens Q again a slice of rows at a time: dL/dx = (dL/dy * s) Q
    ((..., N) -> (..., K)), or dL/dy (s Q) with scales per group, and dL/db = the sum of dL/dy. Q and s are
    frozen: no gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, q: Tensor, scale: Tensor, bias: Tensor | None) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(q, scale)
        ctx.has_bias = bias is not None
        return int8_linear(x, q, scale, None if bias is None else bias.detach())

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, None, None, Tensor | None]:  # noqa: ANN001
        q, scale = ctx.saved_tensors
        n_out, n_in = q.shape
        grouped = scale.dim() == 2
        scaled = grad if grouped else grad * scale.to(grad.dtype)  # (..., N)
        step = max(1, DEQUANTIZE_SLICE // max(n_in, 1))
        grad_x = None
        if ctx.needs_input_grad[0]:
            for start in range(0, n_out, step):  # (..., N_slice) @ (N_slice, K), summed over the slices
                rows = slice(start, start + step)
                widened = dequantize(q[rows], scale[rows], grad.dtype) if grouped else q[rows].to(grad.dtype)
                part = scaled[..., rows] @ widened
                grad_x = part if grad_x is None else grad_x.add_(part)
        grad_bias = grad.reshape(-1, n_out).sum(0) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return grad_x, None, None, grad_bias


class Int8Linear(nn.Module):
    """A linear layer holding int8 weights ``qweight`` (N, K), float scales ``weight_scale`` and a bias.

    ``group_size`` 0 (the default): ``weight_scale`` is (N,), one scale per output row; g > 0 (a multiple of 32
    dividing K): (N, K / g), one per group of g weights along a row (GGUF's Q8_0 for g = 32).
    ``weight`` is the dequantized matrix s Q (computed on access), so code that reads a layer's
    weights (inspection, stacking) sees the numbers the layer multiplies by. Q and s are parameters without
    gradient: they count in ``parameters()`` like the matrix they replace, stay shared when a tied module
    moves to another device, and are never trained.
    """

    activations = "float"  # or "int8": see the module docstring; set per layer (quantize_model's activations=)
    ones: Tensor  # (N,) bfloat16 ones, a buffer

    def __init__(self, in_features: int, out_features: int, bias: bool = True, group_size: int = 0) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.group_size = check_group_size(group_size, in_features)
        self._packed: tuple[tuple, object] | None = None  # (the key of Q and s it was made from, fbgemm's copy)
        self.qweight = frozen(torch.zeros(out_features, in_features, dtype=torch.int8))
        scales = (out_features, in_features // group_size) if group_size else (out_features,)
        self.weight_scale = frozen(torch.ones(scales))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.register_buffer("ones", torch.ones(out_features, dtype=torch.bfloat16), persistent=False)

    @classmethod
    def from_float(cls, weight: Tensor, bias: Tensor | None = None, group_size: int = 0) -> Int8Linear:
        """The int8 layer for the float layer with ``weight`` (N, K) and ``bias`` (N,): one scale per row, or per
        group of ``group_size`` weights."""
        out_features, in_features = weight.shape
        layer = cls(in_features, out_features, bias=bias is not None, group_size=group_size)
        q, scale = quantize_per_group(weight, group_size) if group_size else quantize_per_channel(weight)
        layer.qweight.data = q.to(weight.device)
        layer.weight_scale.data = scale.to(device=weight.device, dtype=weight.dtype)
        if bias is not None:
            layer.bias.data = bias.detach().clone()  # type: ignore[union-attr]
        return layer

    @classmethod
    def from_gguf(cls, data: object, kind: str, shape: Sequence[int], bias: Tensor | None = None) -> Int8Linear:
        """The layer of a GGUF matrix stored as ``kind`` "Q8_0" blocks (``tensor.data``, the raw bytes) of
        ``shape`` (out_features, in_features): the blocks as they are, groups of 32 with the float16 scales d
        widened to float32 and the levels q as stored, so ``weight`` is exactly the file's d q
        (:mod:`qkv.quantization.gguf_blocks`)."""
        if kind != "Q8_0":
            raise QkvError(f"{kind} blocks into an int8 layer: it takes Q8_0 (Q4_0 and Q4_1 go to an int4 layer)")
        q, d = q8_0_levels(data, shape)  # (N, K) int8, (N, K / 32) float16
        layer = cls(q.shape[1], q.shape[0], bias=bias is not None, group_size=Q8_0_GROUP)
        layer.qweight.data, layer.weight_scale.data = q, d.float()
        if bias is not None:
            layer.bias.data = bias.detach().clone()  # type: ignore[union-attr]
        return layer

    @classmethod
    def cat(cls, layers: Sequence[Int8Linear]) -> Int8Linear:
        """One layer computing ``[l(x) for l in layers]`` concatenated on the last axis, e.g. fused W_q, W_k, W_v.

        Each output row keeps its own scales, so the stacked layer gives the same numbers as the parts.
        """
        first = layers[0]
        widths, biases = {layer.in_features for layer in layers}, {layer.bias is None for layer in layers}
        groups = {layer.group_size for layer in layers}
        if len(widths) > 1 or len(biases) > 1 or len(groups) > 1:
            raise ValueError("stacked int8 layers need one input width, one group size and all or none with a bias")
        n_out = sum(layer.out_features for layer in layers)
        stacked = cls(first.in_features, n_out, bias=first.bias is not None, group_size=first.group_size)
        stacked.activations = first.activations
        stacked.qweight.data = torch.cat([layer.qweight for layer in layers])
        stacked.weight_scale.data = torch.cat([layer.weight_scale for layer in layers])
        if first.bias is not None:
            stacked.bias.data = torch.cat([layer.bias for layer in layers])  # type: ignore[union-attr, misc]
        return stacked

    @property
    def weight(self) -> Tensor:
        """The dequantized weight matrix s Q (N, K), a new tensor on every access."""
        return dequantize(self.qweight, self.weight_scale)

    def packed(self) -> object | None:
        """fbgemm's packed copy of Q for int8 activations, made on first use and again when Q or s change; None
        where that path does not apply (scales per group, another device, no fbgemm, inside torch.compile)."""
        q, scale = self.qweight, self.weight_scale
        if self.group_size or q.device.type != "cpu" or not dynamic.available() or torch.compiler.is_compiling():
            return None
        key = (q.data_ptr(), q._version, scale.data_ptr(), scale._version, scale.dtype)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, dynamic.pack(q, scale))
        return self._packed[1]

    def forward(self, x: Tensor) -> Tensor:
        if x.requires_grad and torch.is_grad_enabled():  # training above a frozen int8 base (LoRA): dL/dx only
            return Int8Product.apply(x, self.qweight, self.weight_scale, self.bias)
        blocks = self.activations == "int8x2" or self.activations == "int8" and self.group_size
        if blocks and x.numel():  # x in int8 blocks of 32 (once or twice), as the C step
            rounded = round_activations(x.float(), self.activations)  # (..., K) float32
            return _dequantized_product(rounded, self.qweight, self.weight_scale, self.bias).to(x.dtype)
        if self.activations == "int8" and x.dtype == torch.float32 and (packed := self.packed()) is not None:
            return dynamic.dynamic_int8_linear(x, packed, self.bias)
        ones = self.ones if self.ones.dtype == torch.bfloat16 else None  # model.to(dtype) converts buffers
        return int8_linear(x, self.qweight, self.weight_scale, self.bias, ones)  # (..., K) -> (..., N)

    def extra_repr(self) -> str:
        activations = ACTIVATION_NOTES[self.activations]
        groups = f", groups of {self.group_size}" if self.group_size else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"int8{groups}{activations}"
        )


@fuse_linears.register
def _fuse_int8(first: Int8Linear, *others: nn.Module) -> nn.Module:
    """W_q, W_k, W_v (or W_g, W_1) as one stacked int8 layer: each row keeps its scale, so the same numbers."""
    modules = (first, *others)
    if all(type(m) is Int8Linear and m.activations == first.activations for m in modules):
        try:
            return Int8Linear.cat(modules)  # type: ignore[arg-type]
        except ValueError:  # different input widths or group sizes, or some without a bias
            pass
    return ConcatenatedProjections(modules)
