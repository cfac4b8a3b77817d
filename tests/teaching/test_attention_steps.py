"""The seed-003 build-up of self-attention, checked against the book's printed numbers, an independent
numpy / plain-Python computation, and the core attention module it must agree with."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from qkv.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from qkv.teaching.attention_steps import (
    CausalAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
    attention_without_weights,
    causal_weights_masked,
    causal_weights_renormalized,
    naive_softmax,
    simple_normalize,
    wrapper_to_multihead,
)

# Seed 003: "Your journey starts with one step", embedded in 3 dimensions.
JOURNEY = [
    [0.43, 0.15, 0.89],  # Your
    [0.55, 0.87, 0.66],  # journey
    [0.57, 0.85, 0.64],  # starts
    [0.22, 0.58, 0.33],  # with
    [0.77, 0.25, 0.10],  # one
    [0.05, 0.80, 0.55],  # step
]


@pytest.fixture
def inputs() -> torch.Tensor:
    return torch.tensor(JOURNEY)


def _numpy_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- 3.3.1 ------------------------------------------------------------------------------------------------


def test_journey_query_matches_book(inputs: torch.Tensor) -> None:
    scores, weights, context = attention_without_weights(inputs)
    # The values the book prints for query x^(2) = "journey".
    book_scores = [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]
    book_weights = [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]
    book_context = [0.4419, 0.6515, 0.5683]
    torch.testing.assert_close(scores[1], torch.tensor(book_scores), atol=1e-4, rtol=0)
    torch.testing.assert_close(weights[1], torch.tensor(book_weights), atol=1e-4, rtol=0)
    torch.testing.assert_close(context[1], torch.tensor(book_context), atol=1e-4, rtol=0)
    # The "simple way" (divide by the sum) the book shows first.
    book_simple = [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656]
    torch.testing.assert_close(simple_normalize(scores[1]), torch.tensor(book_simple), atol=1e-4, rtol=0)


def test_journey_full_matrices_match_numpy(inputs: torch.Tensor) -> None:
    x = np.array(JOURNEY, dtype=np.float64)
    omega = np.array([[sum(a * b for a, b in zip(xi, xj, strict=True)) for xj in JOURNEY] for xi in JOURNEY])
    alpha = _numpy_softmax(omega)
    z = alpha @ x
    scores, weights, context = attention_without_weights(inputs.double())
    np.testing.assert_allclose(scores.numpy(), omega, atol=1e-12)
    np.testing.assert_allclose(weights.numpy(), alpha, atol=1e-12)
    np.testing.assert_allclose(context.numpy(), z, atol=1e-12)
    np.testing.assert_allclose(weights.sum(-1).numpy(), np.ones(6), atol=1e-12)


def test_attention_without_weights_batches(inputs: torch.Tensor) -> None:
    batch = torch.stack([inputs, inputs.flip(0)])  # (2, 6, 3)
    scores, weights, context = attention_without_weights(batch)
    assert scores.shape == weights.shape == (2, 6, 6) and context.shape == (2, 6, 3)
    for b in range(2):
        torch.testing.assert_close(context[b], attention_without_weights(batch[b])[2])


def test_naive_softmax_agrees_then_overflows() -> None:
    x = torch.tensor([2.0, 4.0, 5.0])  # seed 000's example
    torch.testing.assert_close(naive_softmax(x), torch.tensor([0.0351, 0.2595, 0.7054]), atol=1e-4, rtol=0)
    big = torch.tensor([1000.0, 1001.0])
    assert torch.isnan(naive_softmax(big)).all()  # exp overflows to inf, inf / inf = nan
    assert torch.isfinite(torch.softmax(big, dim=-1)).all()


# --- 3.4 --------------------------------------------------------------------------------------------------


def test_self_attention_book_outputs(inputs: torch.Tensor) -> None:
    torch.manual_seed(123)
    v1 = SelfAttentionV1(3, 2)
    book_v1 = [
        [0.2996, 0.8053],
        [0.3061, 0.8210],
        [0.3058, 0.8203],
        [0.2948, 0.7939],
        [0.2927, 0.7891],
        [0.2990, 0.8040],
    ]
    torch.testing.assert_close(v1(inputs), torch.tensor(book_v1), atol=1e-4, rtol=0)
    torch.manual_seed(789)
    v2 = SelfAttentionV2(3, 2)
    book_v2 = [
        [-0.0739, 0.0713],
        [-0.0748, 0.0703],
        [-0.0749, 0.0702],
        [-0.0760, 0.0685],
        [-0.0763, 0.0679],
        [-0.0754, 0.0693],
    ]
    torch.testing.assert_close(v2(inputs), torch.tensor(book_v2), atol=1e-4, rtol=0)


def test_self_attention_v1_matches_numpy(inputs: torch.Tensor) -> None:
    v1 = SelfAttentionV1(3, 2).double()
    x = np.array(JOURNEY)
    wq, wk, wv = (p.detach().numpy() for p in (v1.W_query, v1.W_key, v1.W_value))
    q, k, v = x @ wq, x @ wk, x @ wv
    expected = _numpy_softmax(q @ k.T / math.sqrt(2)) @ v
    np.testing.assert_allclose(v1(inputs.double()).detach().numpy(), expected, atol=1e-12)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_v2_weights_copied_into_v1_give_same_outputs(inputs: torch.Tensor, qkv_bias: bool) -> None:
    v2 = SelfAttentionV2(3, 2, qkv_bias=qkv_bias)
    v1 = SelfAttentionV1(3, 2)
    with torch.no_grad():
        v1.W_query.copy_(v2.W_query.weight.T)
        v1.W_key.copy_(v2.W_key.weight.T)
        v1.W_value.copy_(v2.W_value.weight.T)
    if qkv_bias:  # V1 has no bias: the outputs must now differ, proving the comparison can fail
        assert not torch.allclose(v1(inputs), v2(inputs), atol=1e-4)
    else:
        torch.testing.assert_close(v1(inputs), v2(inputs), atol=1e-6, rtol=0)


# --- seed 004: "The quick brown fox jumps" -----------------------------------------------------------------

FOX_Q = [[0.1, 0.2], [0.5, 0.6], [0.9, 1.0], [1.3, 1.4], [1.7, 1.8]]
FOX_K = [[0.2, 0.1], [0.6, 0.5], [1.0, 0.9], [1.4, 1.3], [1.8, 1.7]]
FOX_V = [[0.3, 0.4], [0.7, 0.8], [1.1, 1.2], [1.5, 1.6], [1.9, 2.0]]


def _attend_by_hand(query: list[float], keys: list[list[float]], values: list[list[float]]):
    """Step 4 of seed 004 in plain Python: dot products, scale by 1/sqrt(d_k), softmax, weighted sum."""
    scores = [sum(q * k for q, k in zip(query, key, strict=True)) / math.sqrt(len(query)) for key in keys]
    exps = [math.exp(s) for s in scores]
    weights = [e / sum(exps) for e in exps]
    output = [sum(w * v[d] for w, v in zip(weights, values, strict=True)) for d in range(len(values[0]))]
    return weights, output


@pytest.mark.parametrize("causal", [False, True])
def test_quick_brown_fox(causal: bool) -> None:
    q, k, v = (torch.tensor(t, dtype=torch.float64) for t in (FOX_Q, FOX_K, FOX_V))
    quick = 1
    visible = quick + 1 if causal else 5  # causal: "quick" sees only "The" and "quick"
    hand_weights, hand_out = _attend_by_hand(FOX_Q[quick], FOX_K[:visible], FOX_V[:visible])
    hand_weights += [0.0] * (5 - visible)

    out, weights = scaled_dot_product_attention(q, k, v, causal=causal, need_weights=True)
    torch.testing.assert_close(weights[quick], torch.tensor(hand_weights, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(out[quick], torch.tensor(hand_out, dtype=torch.float64), atol=1e-12, rtol=0)
    fast, none = scaled_dot_product_attention(q, k, v, causal=causal)
    assert none is None
    torch.testing.assert_close(fast[quick], torch.tensor(hand_out, dtype=torch.float64), atol=1e-12, rtol=0)


# --- 3.5.1 ------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(1, 3), st.integers(1, 8)).map(lambda s: (s[0], s[1], s[1])),
        elements=st.floats(-20, 20),
    )
)
def test_two_causal_masks_agree(scores: np.ndarray) -> None:
    s = torch.from_numpy(scores)
    renormalized, masked = causal_weights_renormalized(s).numpy(), causal_weights_masked(s).numpy()
    np.testing.assert_allclose(renormalized, masked, atol=1e-6, rtol=0)
    upper = np.triu(np.ones(scores.shape[-2:], dtype=bool), k=1)
    for w in (renormalized, masked):
        np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-12, rtol=0)
        assert (w[..., upper] == 0).all()  # exactly zero, not just small
    # Independent check: row i is the plain softmax of its first i + 1 scores.
    expected = np.zeros_like(scores)
    for b in range(scores.shape[0]):
        for i in range(scores.shape[1]):
            expected[b, i, : i + 1] = _numpy_softmax(scores[b, i, : i + 1])
    np.testing.assert_allclose(masked, expected, atol=1e-12)


# --- 3.5.3 ------------------------------------------------------------------------------------------------


def test_causal_attention_book_output_and_core_parity(inputs: torch.Tensor) -> None:
    batch = torch.stack((inputs, inputs))  # (2, 6, 3), as in the seed
    torch.manual_seed(123)
    ca = CausalAttention(3, 2, context_length=6, dropout=0.0)
    book_first_head = [
        [-0.4519, 0.2216],
        [-0.5874, 0.0058],
        [-0.6300, -0.0632],
        [-0.5675, -0.0843],
        [-0.5526, -0.0981],
        [-0.5299, -0.1081],
    ]
    out = ca(batch)
    assert out.shape == (2, 6, 2)
    torch.testing.assert_close(out[0], torch.tensor(book_first_head), atol=1e-4, rtol=0)
    q, k, v = ca.W_query(batch), ca.W_key(batch), ca.W_value(batch)
    torch.testing.assert_close(out, scaled_dot_product_attention(q, k, v, causal=True)[0], atol=1e-6, rtol=0)


def test_causal_attention_never_looks_ahead() -> None:
    ca = CausalAttention(4, 3, context_length=10, dropout=0.0).eval()
    x = torch.randn(2, 10, 4)
    out = ca(x)
    for t in range(10):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :]) * 10
        new = ca(changed)
        assert torch.equal(new[:, : t + 1], out[:, : t + 1])
        if t < 9:
            assert not torch.allclose(new[:, t + 1 :], out[:, t + 1 :])


def test_causal_attention_rejects_too_long_input() -> None:
    with pytest.raises(ValueError, match="context_length"):
        CausalAttention(4, 3, context_length=5, dropout=0.0)(torch.randn(1, 6, 4))


def test_dropout_on_attention_weights() -> None:
    p, n = 0.5, 64
    ca = CausalAttention(8, 4, context_length=n, dropout=p)
    x = torch.randn(8, n, 8)
    visible = torch.ones(n, n, dtype=torch.bool).tril().expand(8, n, n)

    ca.train()
    dropped = ca.attention_weights(x)
    ca.eval()
    kept = ca.attention_weights(x)
    zero_fraction = (dropped[visible] == 0).float().mean().item()
    assert abs(zero_fraction - p) < 0.03  # 8 * 2080 visible weights: std of the fraction ~0.004
    assert (dropped[~visible] == 0).all()
    survivors = dropped != 0
    torch.testing.assert_close(dropped[survivors], kept[survivors] / (1 - p))  # inverted dropout scaling

    torch.testing.assert_close(ca(x), ca(x), atol=0, rtol=0)  # eval: deterministic
    torch.testing.assert_close(ca(x), kept @ ca.W_value(x), atol=0, rtol=0)


# --- 3.6 --------------------------------------------------------------------------------------------------


def test_wrapper_book_example(inputs: torch.Tensor) -> None:
    batch = torch.stack((inputs, inputs))
    torch.manual_seed(123)
    mha = MultiHeadAttentionWrapper(3, 2, context_length=6, dropout=0.0, num_heads=2, out_proj=False)
    out = mha(batch)
    assert out.shape == (2, 6, 4)  # two heads of d_out = 2, concatenated
    book = [
        [-0.4519, 0.2216, 0.4772, 0.1063],
        [-0.5874, 0.0058, 0.5891, 0.3257],
        [-0.6300, -0.0632, 0.6202, 0.3860],
        [-0.5675, -0.0843, 0.5478, 0.3589],
        [-0.5526, -0.0981, 0.5321, 0.3428],
        [-0.5299, -0.1081, 0.5077, 0.3493],
    ]
    torch.testing.assert_close(out[1], torch.tensor(book), atol=1e-4, rtol=0)
    # Each block of the output is exactly one head's output.
    torch.testing.assert_close(out[..., 2:], mha.heads[1](batch), atol=0, rtol=0)
    # With d_out = 1 per head, two heads give back a 2-dimensional output (3.6.1).
    assert MultiHeadAttentionWrapper(3, 1, 6, 0.0, num_heads=2, out_proj=False)(batch).shape == (2, 6, 2)


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4])
@pytest.mark.parametrize("qkv_bias", [False, True])
@pytest.mark.parametrize("out_proj", [True, False])
def test_wrapper_equals_weight_split_multihead(num_heads: int, qkv_bias: bool, out_proj: bool) -> None:
    head_dim = 4
    d_model = num_heads * head_dim
    wrapper = MultiHeadAttentionWrapper(d_model, head_dim, 7, 0.1, num_heads, qkv_bias=qkv_bias, out_proj=out_proj)
    if qkv_bias:
        for head in wrapper.heads:  # default Linear biases are small: make sure they matter
            for lin in (head.W_query, head.W_key, head.W_value):
                torch.nn.init.normal_(lin.bias)
    wrapper.eval()
    mha = wrapper_to_multihead(wrapper)
    assert isinstance(mha, MultiHeadAttention) and not mha.training
    x = torch.randn(3, 7, d_model)
    expected = wrapper(x)
    out, _ = mha(x, causal=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    out_explicit, weights = mha(x, causal=True, need_weights=True)
    torch.testing.assert_close(out_explicit, expected, atol=1e-6, rtol=0)
    for h, head in enumerate(wrapper.heads):
        torch.testing.assert_close(weights[:, h], head.attention_weights(x), atol=1e-6, rtol=0)
    assert not torch.allclose(mha(x)[0], expected, atol=1e-3)  # without the causal mask they differ


def test_wrapper_to_multihead_detects_a_wrong_head_order() -> None:
    wrapper = MultiHeadAttentionWrapper(8, 4, 5, 0.0, num_heads=2).eval()
    mha = wrapper_to_multihead(wrapper)
    with torch.no_grad():  # swap the two heads' query rows: the equivalence must break
        mha.query.weight.copy_(mha.query.weight.roll(4, dims=0))
    x = torch.randn(2, 5, 8)
    assert not torch.allclose(mha(x, causal=True)[0], wrapper(x), atol=1e-4)


def test_wrapper_to_multihead_needs_square_projection() -> None:
    with pytest.raises(ValueError, match="d_in == num_heads"):
        wrapper_to_multihead(MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2))


def test_the_teaching_steps_are_not_among_the_layers_public_names() -> None:
    import qkv.layers

    teaching = {"SelfAttentionV1", "SelfAttentionV2", "CausalAttention", "MultiHeadAttentionWrapper",
                "attention_without_weights", "causal_weights_masked", "causal_weights_renormalized"}  # fmt: skip
    assert not teaching & set(qkv.layers.__all__) and not any(hasattr(qkv.layers, name) for name in teaching)


def test_the_package_exports_the_build_up() -> None:
    import qkv.teaching
    from qkv.teaching import attention_steps

    assert qkv.teaching.__all__ and all(
        getattr(qkv.teaching, n) is getattr(attention_steps, n) for n in qkv.teaching.__all__
    )
