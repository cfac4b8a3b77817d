"""The decode step of a decoder-only model in one call to C: the "native" step strategy.

:mod:`qkv.decoding.decode_step` computes a step with PyTorch operations, about 15 per block; on a model of
many small blocks (SmolLM2-135M: 30 blocks of width 576) dispatching them costs as much as reading the weights.
:mod:`qkv.native`'s ``decode_step.c`` computes the same step (norms, W_q W_k W_v as one product, RoPE, the cache
write, attention over the cache, W_o, the feed-forward plain or gated, the final norm, W_U) in one call with one
parallel region. The embedding lookup too, where the token table is float32 or int8 (a tied int8 W_U, per row or
in groups), with the rows of a learned or sinusoidal positional table added (GPT-2); otherwise it stays here
(:func:`embed_step`).

:func:`describe` turns a model into the C structs (``Model``, ``Layer``, ``Mat``, ``Norm``: pointers into the
model's own tensors, kept alive by the :class:`NativeStep`), or says why it cannot:

- each matrix is one of float32 (``nn.Linear``, :class:`~qkv.layers.linear.Linear`, the unembedding), int8
  (:class:`~qkv.quantization.int8_linear.Int8Linear`, a scale per row or per group of 32 or more columns:
  weight-only, or with int8 activations, computed with VNNI where the CPU has it) or int4
  (:class:`~qkv.quantization.int4_linear.Int4Linear`, groups of 32 to 256); float32 and int4 products keep x
  in float32 (int4 comes out as exact as its dequantized float32 matrix), weight-only int8 multiplies x in
  bfloat16 where the CPU's bfloat16 dot products pay (AMD's, with AVX512_BF16), as PyTorch's int8 kernel does,
  and in float32 elsewhere (:func:`int8_in_bfloat16`), and int8 activations round x to int8 blocks (int4
  layers then multiply 16 rows at a time, one to a lane: ``int4_lanes.h``), once or twice ("int8x2": what the
  first rounding missed, rounded again, multiplied in the same pass over the weights: ``Mat.slices``);
- the blocks are pre-LN (RMSNorm or LayerNorm), self-attention only, with or without RoPE, biases, grouped
  keys and values, or a sliding window; the feed-forward plain or gated with one of qkv's activations;
- the model is float32 on the CPU.

Anything else (post-LN, float64 or bfloat16, a projection of mixed kinds, a GPU) runs the PyTorch step.
"""

from __future__ import annotations

import ctypes
import itertools
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import torch
from torch import Tensor, nn

from qkv import native
from qkv.decoding.configs import decoder_config
from qkv.decoding.decode_step import decoder_blocks, embed_step
from qkv.decoding.lane_layout import LANE_ROWS, int8_lanes
from qkv.layers.embedding import TokenEmbedding, Unembedding
from qkv.layers.feedforward import ACTIVATION_FUNCTIONS
from qkv.layers.linear import Linear
from qkv.layers.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from qkv.models.family import family_of
from qkv.quantization.activation_blocks import BLOCK, INT8_ACTIVATIONS, ROUNDINGS
from qkv.quantization.int4_linear import Int4Linear
from qkv.quantization.int8_embedding import Int8TokenEmbedding
from qkv.quantization.int8_linear import Int8Linear

if TYPE_CHECKING:
    from qkv.layers.blocks import DecoderBlock
    from qkv.models.gpt import GPT

MAT_F32, MAT_I8, MAT_I8A8, MAT_I4, MAT_I4F = 0, 1, 2, 3, 4
NORM_NONE, NORM_RMS, NORM_LAYER = 0, 1, 2
ACTIVATIONS = {"relu": 0, "gelu": 1, "gelu_tanh": 2, "silu": 3, "relu2": 4}
P = ctypes.c_void_p


class Mat(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("group", ctypes.c_int32),
                ("w", P), ("scale", P), ("s16", P), ("m16", P), ("bias", P), ("lanes", P), ("lane_s", P),
                ("lane_m", P), ("lane_f", P), ("lane_off", P), ("slices", ctypes.c_int32)]  # fmt: skip


class Norm(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int32), ("eps", ctypes.c_float), ("weight", P), ("bias", P)]


class Layer(ctypes.Structure):
    _fields_ = [("norm1", Norm), ("norm2", Norm), ("qkv", Mat), ("out", Mat), ("gate", Mat), ("up", Mat),
                ("down", Mat), ("window", ctypes.c_int32)]  # fmt: skip


class Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "head_dim",
                                                     "d_ff", "vocab", "act", "rope", "rope_len")]  # fmt: skip
    _fields_ += [("cos", P), ("sin", P), ("final_norm", Norm), ("unembed", Mat), ("layers", ctypes.POINTER(Layer)),
                 ("embed", Mat), ("embed_scale", ctypes.c_float), ("positions", P)]  # fmt: skip


_handles = itertools.count()
_steps: weakref.WeakValueDictionary[int, NativeStep] = weakref.WeakValueDictionary()  # handle -> step (for the op)


class Unsupported(Exception):
    """Why a model cannot run the native step (one sentence)."""


class NativeStep:
    """A model described to the C step, and the step: logits for one new token per row."""

    def __init__(self, model: GPT, projections: Sequence[nn.Module]) -> None:
        self._start()
        self.model = model
        self.struct = self._describe(model, projections)
        self.handle = next(_handles)  # how the op qkv::native_decode_step finds this step (torch.compile)
        _steps[self.handle] = self

    def _start(self) -> None:
        self._keep: list[object] = []  # the tensors (and ctypes arrays) the structs point into
        self._lane_kernels = lane_kernels()  # which kernels will read Mat.lanes (none: the layers are not repacked)

    @classmethod
    def layers_only(cls) -> NativeStep:
        """A step without a model, whose ``_mat`` describes single layers (:func:`native_product`)."""
        step = cls.__new__(cls)
        step._start()
        return step

    def bind(self, lib: ctypes.CDLL) -> NativeStep:
        """Use the step of the loaded library ``lib``."""
        self._call = lib.qkv_decode_step
        self._call.restype = ctypes.c_int
        self._call.argtypes = [ctypes.POINTER(Model), ctypes.c_int32, P, P, P, P, ctypes.c_int32, P, ctypes.c_int32, P,
                               ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, P, P, ctypes.c_int32]  # fmt: skip
        return self

    def __call__(
        self,
        token_ids: Tensor,
        positions: Tensor,
        kv: Tensor,
        slots: Tensor | None = None,
        outputs: Tensor | None = None,
        argmax: Tensor | None = None,
    ) -> Tensor:
        """Logits (B, V) for ``token_ids`` (B,) at ``positions`` (B,) int64, with the cache ``kv``
        (n_layers, S, 2, h_kv, L, d_k), a view of the engine's pool: row b reads and writes cache row ``slots[b]``
        (default b). Rows may share a cache row at distinct positions (several new tokens of one text: each sees
        the keys of those before it, as if they had come one step at a time). With ``outputs`` (n,), the logits
        (n, V) of those rows only (a prompt's last token). ``argmax``, an int64 tensor of one entry per row of
        logits, receives each row's first largest logit, or -1 where the row holds NaN or inf: the scan of
        :mod:`qkv.native.logit_scan`, done by the step on each part of W_U's rows as it is made."""
        batch, length = token_ids.shape[0], kv.shape[4]
        layout = (kv.shape[3] * length * kv.shape[5], length * kv.shape[5], kv.shape[5], 1)
        if kv.dtype != torch.float32 or kv.stride()[2:] != layout:
            raise ValueError("the cache must be float32 with each row's (2, h_kv, L, d_k) contiguous")
        slots = torch.arange(batch) if slots is None else slots.to(torch.int64).contiguous()
        positions = positions.to(torch.int64).contiguous()
        if positions.shape != (batch,) or slots.shape != (batch,):
            raise ValueError(f"{batch} tokens need {batch} positions and slots")
        pairs = slots.tolist(), positions.tolist()
        if (
            max(pairs[1]) >= min(length, self.position_limit)
            or min(pairs[1]) < 0
            or not 0 <= min(pairs[0]) <= max(pairs[0]) < kv.shape[1]
        ):
            raise ValueError(f"positions {pairs[1]} or slots {pairs[0]} do not fit a cache of {tuple(kv.shape)}")
        shared = len(set(pairs[0])) < batch
        if shared and len(set(zip(*pairs, strict=True))) < batch:
            raise ValueError("rows that share a cache row need distinct positions")
        if outputs is not None:
            outputs = outputs.to(torch.int64).contiguous()
            if outputs.numel() and not 0 <= int(outputs.min()) <= int(outputs.max()) < batch:
                raise ValueError(f"outputs {outputs.tolist()} are not rows of {batch}")
        if self.struct.embed.n:  # the C step looks the tokens up in W_E
            token_ids = token_ids.to(torch.int64).contiguous()
            ids = token_ids.tolist()
            if ids and (min(ids) < 0 or max(ids) >= self.struct.embed.n):
                raise IndexError(f"token ids {ids} are not all in the vocabulary of {self.struct.embed.n}")
            x = None
        else:
            x = embed_step(self.model.embedding, token_ids, positions).to(torch.float32).contiguous()  # (B, d_model)
        logits = torch.empty(batch if outputs is None else outputs.numel(), self.struct.vocab)
        if argmax is not None and (argmax.dtype != torch.int64 or argmax.shape != logits.shape[:1]
                                   or not argmax.is_contiguous()):  # fmt: skip
            raise ValueError(f"argmax must be a contiguous int64 tensor of {logits.shape[0]} entries")
        failed = self._call(ctypes.byref(self.struct), batch, None if x is None else x.data_ptr(),
                            token_ids.data_ptr(), positions.data_ptr(), slots.data_ptr(),
                            int(shared), None if outputs is None else outputs.data_ptr(),
                            0 if outputs is None else outputs.numel(), kv.data_ptr(), kv.stride(0), kv.stride(1),
                            length, logits.data_ptr(), None if argmax is None else argmax.data_ptr(),
                            torch.get_num_threads())  # fmt: skip
        if failed:
            raise MemoryError("the native decode step could not allocate its scratch memory")
        return logits

    # ------------------------------------------------------------------------------ describing the model

    def _ptr(self, tensor: Tensor | None, dtype: torch.dtype) -> int | None:
        if tensor is None:
            return None
        if tensor.dtype != dtype or tensor.device.type != "cpu":
            raise Unsupported(f"a tensor is {tensor.dtype} on {tensor.device}, not {dtype} on the CPU")
        tensor = tensor.detach().contiguous()
        self._keep.append(tensor)
        return tensor.data_ptr()

    def _mat(self, module: nn.Module) -> Mat:
        f32 = torch.float32
        bias = self._ptr(getattr(module, "bias", None), f32)
        if type(module) in (nn.Linear, Linear, Unembedding):
            weight = cast(Tensor, module.weight)  # each keeps its float (n, k) matrix as .weight
            n, k = weight.shape
            return Mat(MAT_F32, n, k, 0, self._ptr(weight, f32), None, None, None, bias)
        if type(module) is Int8Linear:
            n, k = module.qweight.shape
            group = module.group_size
            q, scale = self._int8(module.qweight, module.weight_scale, group)
            kind = MAT_I8A8 if module.activations in INT8_ACTIVATIONS and k % BLOCK == 0 else MAT_I8
            slices = ROUNDINGS.get(module.activations, 0)
            if kind == MAT_I8A8 and n >= LANE_ROWS and self._lane_kernels:
                packed, lane_f, lane_off = int8_lanes(module, offsets=self._lane_kernels == 2)
                w, f = self._ptr(packed, torch.int8), self._ptr(lane_f, torch.float32)
                return Mat(kind, n, k, group, q, scale, None, None, bias, w, None, None, f,
                           self._ptr(lane_off, torch.int32), slices)  # fmt: skip
            return Mat(kind, n, k, group, q, scale, None, None, bias, slices=slices)
        if type(module) is Int4Linear:
            n, k = module.out_features, module.in_features
            s, m = self._ptr(module.weight_scale, torch.float16), self._ptr(module.weight_min, torch.float16)
            kind = MAT_I4 if module.activations in INT8_ACTIVATIONS else MAT_I4F
            lanes: tuple[int | None, ...] = (None,) * 3
            if kind == MAT_I4 and n >= LANE_ROWS and self._lane_kernels:
                levels, scales, minimums = module.lanes()  # the layer's own copy
                f16 = torch.float16
                lanes = self._ptr(levels, torch.uint8), self._ptr(scales, f16), self._ptr(minimums, f16)
            q4 = self._ptr(module.qweight, torch.uint8)
            slices = ROUNDINGS.get(module.activations, 0)
            return Mat(kind, n, k, module.group_size, q4, None, s, m, bias, *lanes, slices=slices)
        raise Unsupported(f"a {type(module).__name__} layer (the native step multiplies float32, int8 and int4 ones)")

    def _int8(self, qweight: Tensor, scales: Tensor, group: int) -> tuple[int | None, int | None]:
        """Pointers to an int8 matrix (n, k) and its scales: (n,) with ``group`` 0, else one per ``group`` columns
        (n, k / group), a multiple of 32 dividing k (anything else: Unsupported)."""
        n, k = qweight.shape
        if group and (group % BLOCK or k % group or scales.shape != (n, k // group)):
            raise Unsupported(
                f"an int8 layer of {k} inputs with scales {tuple(scales.shape)} in groups of {group} (the native "
                f"step takes groups of a multiple of {BLOCK} dividing the inputs)"
            )
        return self._ptr(qweight, torch.int8), self._ptr(scales, torch.float32)

    def _norm(self, module: nn.Module) -> Norm:
        if isinstance(module, nn.Identity):
            return Norm(NORM_NONE, 0.0, None, None)
        if isinstance(module, nn.RMSNorm):
            eps = torch.finfo(torch.float32).eps if module.eps is None else module.eps
            return Norm(NORM_RMS, eps, self._ptr(module.weight, torch.float32), None)
        if isinstance(module, nn.LayerNorm):
            weight, bias = self._ptr(module.weight, torch.float32), self._ptr(module.bias, torch.float32)
            return Norm(NORM_LAYER, module.eps, weight, bias)
        raise Unsupported(f"a {type(module).__name__} norm")

    def _layer(self, block: DecoderBlock, projection: nn.Module, gated: bool) -> Layer:
        """One block, its feed-forward gated (act(W_g h) * W_1 h) where the config's block sizes say so."""
        if not (block.self_attn_sublayer.norm_first and block.ffn_sublayer.norm_first):
            raise Unsupported("post-LN blocks (the native step is written for pre-LN ones)")
        ffn = block.feed_forward
        names = ("gate", "linear1", "linear2") if gated else ("linear1", "linear2")
        parts = [getattr(ffn, name, None) for name in names]
        if not all(isinstance(part, nn.Module) for part in parts):
            raise Unsupported(f"a {type(ffn).__name__} feed-forward without {' and '.join(names)}")
        products = [self._mat(cast(nn.Module, part)) for part in parts]
        gate, up, down = products if gated else (Mat(), *products)
        window = block.self_attn.window or 0
        norms = self._norm(block.self_attn_sublayer.norm), self._norm(block.ffn_sublayer.norm)
        mats = self._mat(projection), self._mat(block.self_attn.out_proj)
        return Layer(*norms, *mats, gate, up, down, window)

    def _describe(self, model: GPT, projections: Sequence[nn.Module]) -> Model:
        config, blocks = decoder_config(model), decoder_blocks(model.decoder)
        if next(model.parameters()).device.type != "cpu":
            raise Unsupported("the model is not on the CPU")
        if family_of(model).has("cross-attention"):
            raise Unsupported("blocks with cross-attention")
        activation = blocks[0].feed_forward.activation if len(blocks) else None
        names = [name for name, fn in ACTIVATION_FUNCTIONS.items() if fn is activation]
        if len(blocks) and not names:
            raise Unsupported("an activation the native step does not know")
        gated = config.block_sizes().gated
        layers = (Layer * len(blocks))(*(self._layer(b, p, gated) for b, p in zip(blocks, projections, strict=True)))
        self._keep.append(layers)
        rotary = model.rotary
        tables = None if rotary is None else (cast(Tensor, rotary.cos), cast(Tensor, rotary.sin))  # buffers (L, d_k)
        self.position_limit = self._position_limit(model)
        cos, sin = (self._ptr(tables[0], torch.float32), self._ptr(tables[1], torch.float32)) if tables else (0, 0)
        d_ff = blocks[0].feed_forward.linear1.out_features if len(blocks) else 0
        return Model(len(blocks), config.d_model, config.n_heads, config.n_kv_heads, config.head_dim, d_ff,
                     config.vocab_size, ACTIVATIONS[names[0]] if names else 0, int(rotary is not None),
                     tables[0].shape[0] if tables else 0, cos, sin, self._norm(model.decoder.final_norm),
                     self._mat(model.unembedding), layers, *self._embedding(model.embedding))  # fmt: skip

    @staticmethod
    def _position_limit(model: GPT) -> int:
        """The positions a step may be asked for: the rows of RoPE's tables and of a positional table (no limit
        without either), checked in Python before C could read past them."""
        limits = [cast(Tensor, model.rotary.cos).shape[0]] if model.rotary is not None else []
        positional = model.embedding.positional_encoding
        if isinstance(positional, LearnedPositionalEncoding | SinusoidalPositionalEncoding):
            limits.append(positional.max_len)
        return min(limits, default=1 << 62)

    def _embedding(self, embedding: nn.Module) -> tuple[Mat, float, int | None]:
        """W_E for the C step to look tokens up in, its scale, and the positional table it adds (learned or
        sinusoidal rows, float32; None: none); an empty Mat where the lookup stays in Python (a token embedding of
        another kind, or positions without a float32 table)."""
        table = embedding.token_embedding
        positional, positions = embedding.positional_encoding, None
        if positional is not None:
            rows = {LearnedPositionalEncoding: "weight", SinusoidalPositionalEncoding: "table"}.get(type(positional))
            tensor = getattr(positional, rows) if rows else None
            if not isinstance(tensor, Tensor) or tensor.dtype != torch.float32:
                return Mat(), 1.0, None
            positions = self._ptr(tensor, torch.float32)
        if type(table) is Int8TokenEmbedding:  # the tied int8 W_U's matrix and scales
            n, k = table.qweight.shape
            q, scale = self._int8(table.qweight, table.weight_scale, table.group_size)
            return Mat(MAT_I8, n, k, table.group_size, q, scale), float(table.scale), positions
        plain = cast(nn.Embedding, table) if type(table) in (TokenEmbedding, nn.Embedding) else None
        if plain is not None and plain.max_norm is None and plain.weight.dtype == torch.float32:
            n, k = plain.weight.shape
            weight = self._ptr(plain.weight, torch.float32)
            return Mat(MAT_F32, n, k, 0, weight), float(getattr(plain, "scale", 1.0)), positions
        return Mat(), 1.0, None


@torch.library.custom_op("qkv::native_decode_step", mutates_args=("kv", "argmax"), device_types="cpu")
def native_decode_step(
    token_ids: Tensor, positions: Tensor, kv: Tensor, handle: int, argmax: Tensor | None = None
) -> Tensor:
    """The native step ``handle`` (:attr:`NativeStep.handle`) as one operator: what a compiled step
    (``torch.compile``) calls, so that its graph holds the whole step as one node. (B,) tokens and positions;
    ``argmax``, if given, receives each row's argmax as :meth:`NativeStep.__call__` writes it."""
    return _steps[handle](token_ids, positions, kv, argmax=argmax)


@native_decode_step.register_fake
def _(token_ids: Tensor, positions: Tensor, kv: Tensor, handle: int, argmax: Tensor | None = None) -> Tensor:
    return token_ids.new_empty((token_ids.shape[0], _steps[handle].struct.vocab), dtype=torch.float32)


def native_product(layer: nn.Module, x: Tensor, threads: int | None = None) -> Tensor:
    """``layer(x)`` for x (B, K) float32 computed by the C step's product for the layer's kind (a float32, int8 or
    int4 linear layer), on ``threads`` threads (default: torch's): for tests and benchmarks of the kernels alone.
    Rows the product left unwritten would come back NaN."""
    lib = native.library()
    if lib is None:
        raise RuntimeError(f"the C kernels are unavailable ({native.unavailable_reason()})")
    holder = NativeStep.layers_only()
    mat = holder._mat(layer)
    x = x.to(torch.float32).contiguous()
    y = torch.full((x.shape[0], mat.n), float("nan"))
    lib.qkv_product.argtypes = [ctypes.POINTER(Mat), ctypes.c_int32, P, P, ctypes.c_int32]
    if lib.qkv_product(ctypes.byref(mat), x.shape[0], x.data_ptr(), y.data_ptr(), threads or torch.get_num_threads()):
        raise MemoryError("the native product could not allocate its scratch memory")
    return y


def int8_in_bfloat16(in_features: int) -> bool:
    """Whether the C step multiplies a float-activation int8 layer of ``in_features`` columns with x rounded to
    bfloat16 (a CPU with AVX512_BF16, ``in_features`` a multiple of 32; products.h), as the layer's PyTorch forward
    does; else with x in float32."""
    lib = native.library()
    return lib is not None and in_features % 32 == 0 and bool(lib.qkv_int8_in_bfloat16())


def lane_kernels() -> int:
    """Which C kernels multiply 16 rows to a vector (``Mat.lanes``): 2 AVX-512 VNNI's, 1 AVX2's (which do not read
    ``lane_off``), 0 none (no C kernels, or a CPU without AVX2: the layers are not repacked)."""
    lib = native.library()
    return int(lib.qkv_lane_kernels()) if lib is not None else 0


def native_step(model: GPT, projections: Sequence[nn.Module]) -> NativeStep | str:
    """The :class:`NativeStep` of ``model`` (a GPT or Llama, with W_q W_k W_v fused as ``projections``), or a
    sentence saying why it cannot run one."""
    try:
        step = NativeStep(model, projections)
    except Unsupported as why:
        return f"the native step cannot run this model: {why}"
    lib = native.library()
    if lib is None:
        return f"the C kernels are unavailable ({native.unavailable_reason()})"
    return step.bind(lib)
