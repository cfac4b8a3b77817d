"""The GRU pieces of RNNSearch against torch's own GRU: one step, and the bidirectional encoder with padding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.errors import QkvError
from qkv.layers.gru import BidirectionalGRU, gru_step


def test_gru_step_matches_torch_gru_cell() -> None:
    cell = nn.GRUCell(5, 7).double()
    x, h = torch.randn(4, 5).double(), torch.randn(4, 7).double()
    input_gates = F.linear(x, cell.weight_ih, cell.bias_ih)
    torch.testing.assert_close(gru_step(input_gates, h, cell.weight_hh, cell.bias_hh), cell(x, h), atol=1e-12, rtol=0)


def _one_direction(gru: nn.GRU, suffix: str) -> nn.GRU:
    """A unidirectional nn.GRU holding one direction's weights of a bidirectional one ("" or "_reverse")."""
    single = nn.GRU(gru.input_size, gru.hidden_size, batch_first=True).double()
    with torch.no_grad():
        for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
            getattr(single, name).copy_(getattr(gru, name + suffix))
    return single


def test_bidirectional_encoder_is_torch_gru_forwards_and_on_the_reversed_sentence() -> None:
    encoder = BidirectionalGRU(6, 5).double()
    forward, backward = _one_direction(encoder.gru, ""), _one_direction(encoder.gru, "_reverse")
    lengths = [7, 4, 1, 6]
    x = torch.randn(len(lengths), 7, 6).double()
    padding = torch.arange(7)[None, :] >= torch.tensor(lengths)[:, None]  # (B, S), True at padding
    x_padded = x.masked_fill(padding[:, :, None], 123.0)  # what padding holds must not matter
    out = encoder(x_padded, padding)
    assert out.shape == (4, 7, 10)
    for b, n in enumerate(lengths):
        sentence = x[b : b + 1, :n]  # (1, n, 6): the real tokens only
        expected_fwd = forward(sentence)[0][0]  # (n, 5), left to right
        expected_bwd = backward(sentence.flip(1))[0][0].flip(0)  # right to left, then back in source order
        torch.testing.assert_close(out[b, :n, :5], expected_fwd, atol=1e-12, rtol=0)
        torch.testing.assert_close(out[b, :n, 5:], expected_bwd, atol=1e-12, rtol=0)
        assert (out[b, n:] == 0).all()
    # Without padding the batch runs unpacked and gives the same annotations.
    torch.testing.assert_close(encoder(x[:1]), out[:1], atol=1e-12, rtol=0)


def test_padding_before_the_tokens_or_an_empty_sentence_is_refused() -> None:
    encoder = BidirectionalGRU(3, 2)
    x = torch.randn(2, 3, 3)
    with pytest.raises(QkvError, match="right padding"):
        encoder(x, torch.tensor([[True, False, False], [False, False, False]]))
    with pytest.raises(QkvError, match="no tokens"):
        encoder(x, torch.tensor([[True, True, True], [False, False, False]]))
