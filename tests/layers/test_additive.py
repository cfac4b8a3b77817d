"""Additive (Bahdanau) attention: a plain-Python reference, proper weights, and padding."""

from __future__ import annotations

import math

import pytest
import torch

from qkv.layers.additive import AdditiveAttention


def _additive_by_hand(attn: AdditiveAttention, queries, keys, values, padding=None):
    """e_ij = sum_h v_h tanh(sum_a Wq_ha q_ia + sum_b Wk_hb k_jb), softmax over unpadded j, weighted sum."""
    wq, wk = attn.W_query.weight.tolist(), attn.W_key.weight.tolist()
    v = attn.v.weight[0].tolist()
    contexts, all_weights = [], []
    for b in range(len(queries)):
        rows_c, rows_w = [], []
        for q in queries[b]:
            scores = []
            for j, k in enumerate(keys[b]):
                if padding is not None and padding[b][j]:
                    scores.append(None)
                    continue
                hidden = [
                    math.tanh(
                        sum(w * x for w, x in zip(wq_h, q, strict=True))
                        + sum(w * x for w, x in zip(wk_h, k, strict=True))
                    )
                    for wq_h, wk_h in zip(wq, wk, strict=True)
                ]
                scores.append(sum(vh * hh for vh, hh in zip(v, hidden, strict=True)))
            exps = [0.0 if s is None else math.exp(s) for s in scores]
            total = sum(exps)
            weights = [e / total if total else 0.0 for e in exps]
            rows_w.append(weights)
            rows_c.append(
                [sum(w * val[d] for w, val in zip(weights, values[b], strict=True)) for d in range(len(values[b][0]))]
            )
        contexts.append(rows_c)
        all_weights.append(rows_w)
    return torch.tensor(contexts, dtype=torch.float64), torch.tensor(all_weights, dtype=torch.float64)


@pytest.fixture
def attn() -> AdditiveAttention:
    return AdditiveAttention(query_dim=3, key_dim=5, hidden_dim=4).double()


def test_shapes_and_rows_sum_to_one(attn: AdditiveAttention) -> None:
    q, k, v = torch.randn(2, 4, 3).double(), torch.randn(2, 6, 5).double(), torch.randn(2, 6, 7).double()
    context, weights = attn(q, k, v)
    assert context.shape == (2, 4, 7) and weights.shape == (2, 4, 6)
    assert (weights >= 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, dtype=torch.float64))


def test_matches_hand_loop(attn: AdditiveAttention) -> None:
    q, k, v = torch.randn(2, 3, 3).double(), torch.randn(2, 4, 5).double(), torch.randn(2, 4, 2).double()
    expected_context, expected_weights = _additive_by_hand(attn, q.tolist(), k.tolist(), v.tolist())
    context, weights = attn(q, k, v)
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    torch.testing.assert_close(context, expected_context, atol=1e-12, rtol=0)


def test_padding_gets_zero_weight_and_matches_hand_loop(attn: AdditiveAttention) -> None:
    q, k, v = torch.randn(2, 3, 3).double(), torch.randn(2, 4, 5).double(), torch.randn(2, 4, 2).double()
    padding = torch.tensor([[False, False, True, True], [False, False, False, True]])
    context, weights = attn(q, k, v, key_padding_mask=padding)
    assert (weights[padding[:, None, :].expand_as(weights)] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    expected_context, expected_weights = _additive_by_hand(attn, q.tolist(), k.tolist(), v.tolist(), padding.tolist())
    torch.testing.assert_close(weights, expected_weights, atol=1e-12, rtol=0)
    torch.testing.assert_close(context, expected_context, atol=1e-12, rtol=0)
    # Padding keys' values have no influence on the output.
    v_changed = v.clone()
    v_changed[padding] = 1e6
    torch.testing.assert_close(attn(q, k, v_changed, key_padding_mask=padding)[0], context, atol=0, rtol=0)


def test_fully_padded_row_gives_zeros_not_nan(attn: AdditiveAttention) -> None:
    q, k, v = torch.randn(2, 3, 3).double(), torch.randn(2, 4, 5).double(), torch.randn(2, 4, 2).double()
    padding = torch.tensor([[True, True, True, True], [False, True, True, True]])
    context, weights = attn(q, k, v, key_padding_mask=padding)
    assert torch.isfinite(context).all() and torch.isfinite(weights).all()
    context.sum().backward()  # and no NaN leaks into the gradients either
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
    assert (weights[0] == 0).all() and (context[0] == 0).all()
    torch.testing.assert_close(weights[1, :, 0], torch.ones(3, dtype=torch.float64))  # only key 0 is left
    torch.testing.assert_close(context[1], v[1, 0].expand(3, 2))


def test_query_and_key_sizes_may_differ_and_it_trains() -> None:
    attn = AdditiveAttention(query_dim=2, key_dim=6, hidden_dim=8)
    q, k, v = torch.randn(1, 1, 2), torch.randn(1, 5, 6), torch.eye(5)[None]  # value j = one-hot(j)
    opt = torch.optim.Adam(attn.parameters(), lr=0.1)
    for _ in range(100):  # learn to put the weight on key 3
        context, _ = attn(q, k, v)
        loss = -torch.log(context[0, 0, 3])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert attn(q, k, v)[1][0, 0].argmax().item() == 3
    assert attn(q, k, v)[1][0, 0, 3].item() > 0.9


def test_projected_keys_computed_once_give_the_same_result_and_weights_are_recorded_as_one_head(attn) -> None:
    from qkv.layers.capture import capture

    q, k, v = torch.randn(2, 3, 3).double(), torch.randn(2, 4, 5).double(), torch.randn(2, 4, 2).double()
    padding = torch.tensor([[False, False, False, True], [False, False, False, False]])
    context, weights = attn(q, k, v, key_padding_mask=padding)
    with capture(attn) as acts:
        context_again, _ = attn(q, None, v, key_padding_mask=padding, projected_keys=attn.project_keys(k))
    torch.testing.assert_close(context_again, context, atol=0, rtol=0)
    assert acts["weights"].shape == (2, 1, 3, 4)  # (B, heads, Tq, Tk), like every attention in qkv
    torch.testing.assert_close(acts["weights"][:, 0], weights, atol=0, rtol=0)
