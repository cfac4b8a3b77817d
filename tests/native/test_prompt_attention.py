"""The C library's causal attention of a whole sequence, and its gradients, against PyTorch's
``F.scaled_dot_product_attention`` in float64, and where attention hands it its work (only where it takes the
tensors)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from qkv import native
from qkv.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from qkv.native import prompt_attention

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler for the native library")
needs_kernel = pytest.mark.skipif(
    native.library() is None or not prompt_attention.built(), reason="a build without AVX-512: PyTorch computes it"
)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int = 0) -> torch.Tensor:
    """Float64 attention of queries at the last Tq of Tk positions, causal, within ``window`` keys (0: all)."""
    n_queries, n_keys = q.shape[-2], k.shape[-2]
    i = torch.arange(n_queries)[:, None] + n_keys - n_queries
    j = torch.arange(n_keys)[None, :]
    mask = (j <= i) & ((j > i - window) if window else torch.ones_like(j, dtype=torch.bool))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)


CASES = [  # batch, query heads, key/value heads, queries, keys, d_k, window
    (1, 9, 3, 300, 300, 64, 0),  # SmolLM2's heads, a prompt of 300
    (2, 4, 2, 37, 50, 32, 0),  # fewer queries than keys (after a cached prefix); tiles of 8 and blocks of 32 cut
    (1, 2, 2, 33, 33, 16, 0),
    (1, 4, 1, 70, 100, 128, 0),  # multi-query
    (1, 4, 2, 100, 100, 64, 17),  # a sliding window
    (1, 2, 1, 40, 41, 256, 5),
]


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_the_c_kernel_computes_pytorchs_attention(case: tuple[int, ...]) -> None:
    batch, heads, kv_heads, n_queries, n_keys, d, window = case
    torch.manual_seed(0)
    q = torch.randn(batch, heads, n_queries, d) * 3  # sharp weights: the running maximum moves
    k, v = torch.randn(batch, kv_heads, n_keys, d), torch.randn(batch, kv_heads, n_keys, d)
    assert prompt_attention.applies(q, k, v)
    ours = prompt_attention.causal_attention(q, k, v, window=window or None)
    assert ours is not None and ours.shape == q.shape
    assert torch.allclose(ours.double(), reference(q, k, v, window), atol=2e-5, rtol=1e-5)


@needs_kernel
def test_strided_heads_and_a_scale() -> None:
    """Heads split from a projection's output (B, T, h, d_k) viewed as (B, h, T, d_k), without a copy."""
    torch.manual_seed(1)
    q = torch.randn(2, 64, 6, 32).transpose(1, 2)
    k, v = torch.randn(2, 80, 3, 32).transpose(1, 2), torch.randn(2, 80, 3, 32).transpose(1, 2)
    ours = prompt_attention.causal_attention(q, k, v, scale=0.3)
    assert ours is not None
    theirs = reference(q * (0.3 * 32**0.5), k, v)  # F's scale is 1 / sqrt(d_k)
    assert torch.allclose(ours.double(), theirs, atol=2e-5, rtol=1e-5)


def test_a_build_for_an_avx512_cpu_has_the_kernel() -> None:
    """-march=native on a CPU with AVX-512 (torch's capability says so) builds the kernel."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX512_BF16"):
        pytest.skip("this CPU has no AVX-512")
    if os.environ.get("CC"):
        pytest.skip("a compiler of the user's choosing ($CC), which may target another CPU")
    assert prompt_attention.built()


def test_what_the_kernel_does_not_take_stays_with_pytorch() -> None:
    q, k, v = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    assert prompt_attention.applies(q, k, v)
    assert not prompt_attention.applies(q[:, :, :4], k, v)  # a decoding step's few queries
    assert not prompt_attention.applies(q.double(), k.double(), v.double())
    assert not prompt_attention.applies(q[..., :24], k[..., :24], v[..., :24])  # d_k not a multiple of 16
    assert not prompt_attention.applies(q, k, v, dropout_p=0.1)
    assert not prompt_attention.applies(q.detach(), k[:, :, :10], v[:, :, :10])  # more queries than keys


@needs_kernel
@pytest.mark.parametrize("case", CASES)
def test_the_gradients_are_pytorchs(case: tuple[int, ...]) -> None:
    """dL/dq, dL/dk and dL/dv of the kernel's attention (attention_backward.h) against autograd's through the
    float64 reference, for a random dL/dout; the heads that share a key/value head add into its dK and dV."""
    batch, heads, kv_heads, n_queries, n_keys, d, window = case
    torch.manual_seed(0)
    q = (torch.randn(batch, heads, n_queries, d) * 3).requires_grad_()
    k, v = torch.randn(batch, kv_heads, n_keys, d, requires_grad=True), torch.randn(batch, kv_heads, n_keys, d)
    v.requires_grad_()
    assert prompt_attention.applies(q, k, v)
    ours = prompt_attention.causal_attention(q, k, v, window=window or None)
    assert ours is not None and ours.requires_grad
    grad = torch.randn_like(ours)
    mine = torch.autograd.grad(ours, (q, k, v), grad)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    theirs = torch.autograd.grad(reference(*wide, window), wide, grad.double())
    assert torch.allclose(ours.double(), reference(q, k, v, window), atol=2e-5, rtol=1e-5)
    for got, want in zip(mine, theirs, strict=True):
        assert got.shape == want.shape
        assert torch.allclose(got.double(), want, atol=5e-5, rtol=1e-5), (got.double() - want).abs().max()


@needs_kernel
def test_a_training_layer_takes_the_kernel_and_gets_pytorchs_gradients(monkeypatch) -> None:
    """A grouped-query layer with a sliding window, training (gradients on): its attention goes through the kernel
    and its weights' gradients are those of PyTorch's road (the kernel refused)."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, n_kv_heads=2, window=40)
    x = torch.randn(2, 96, 64, requires_grad=True)
    calls = []
    real = prompt_attention.CausalAttention.apply
    monkeypatch.setattr(prompt_attention.CausalAttention, "apply", lambda *a: calls.append(1) or real(*a))
    ours, _ = layer(x, causal=True)
    ours.pow(2).sum().backward()
    mine = [x.grad.clone(), *(p.grad.clone() for p in layer.parameters())]
    assert calls
    x.grad = None
    layer.zero_grad()
    monkeypatch.setattr(prompt_attention, "applies", lambda *a, **k: False)
    theirs, _ = layer(x, causal=True)
    theirs.pow(2).sum().backward()
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)
    for got, want in zip(mine, [x.grad, *(p.grad for p in layer.parameters())], strict=True):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_attention_hands_a_prompt_to_the_kernel_and_gets_pytorchs_numbers(monkeypatch) -> None:
    """A multi-head attention layer under no_grad (the kernel) and with gradients (PyTorch): the same output, and
    the kernel was called."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 4, n_kv_heads=2, window=40).eval()
    x = torch.randn(2, 96, 64)
    theirs, _ = layer(x, causal=True)
    calls = []
    real = prompt_attention.causal_attention
    monkeypatch.setattr(prompt_attention, "causal_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    with torch.no_grad():
        ours, _ = layer(x, causal=True)
    assert calls and torch.allclose(ours, theirs, atol=1e-5, rtol=1e-5)


def test_the_function_of_attention_routes_only_causal_unmasked_work() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    mask = torch.rand(64, 64) > 0.3
    mask[:, 0] = True
    ours, _ = scaled_dot_product_attention(q, k, v, mask, causal=True)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask & torch.ones(64, 64, dtype=torch.bool).tril())
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_where_the_library_cannot_pytorch_computes_it(monkeypatch) -> None:
    """A build without AVX-512 answers 1: attention then takes PyTorch's road, with its numbers."""

    class Without:
        @staticmethod
        def qkv_causal_attention(*args: object) -> int:
            return 1

    monkeypatch.setattr(prompt_attention, "library", lambda: Without())
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32), torch.randn(1, 2, 64, 32)
    assert prompt_attention.causal_attention(q, k, v) is None
    ours, _ = scaled_dot_product_attention(q, k, v, causal=True)
    assert torch.equal(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))


def test_where_the_library_lacks_the_kernel_training_takes_pytorchs_road(monkeypatch) -> None:
    """With gradients wanted and no kernel in the library (a build without AVX-512), attention is PyTorch's."""
    monkeypatch.setattr(prompt_attention, "built", lambda: False)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 32, requires_grad=True) for _ in range(3))
    assert prompt_attention.causal_attention(q, k, v) is None
    ours, _ = scaled_dot_product_attention(q, k, v, causal=True)
    assert ours.requires_grad and torch.equal(ours, F.scaled_dot_product_attention(q, k, v, is_causal=True))
