"""Maxout: the largest of each pool of linear values; with one piece fixed at 0 it is a ReLU."""

from __future__ import annotations

import torch

from qkv.layers.maxout import Maxout


def test_maxout_is_the_max_of_each_pool_of_the_linear_map() -> None:
    layer = Maxout(4, 3, pool=2).double()
    x = torch.randn(2, 5, 4).double()
    linear = x @ layer.linear.weight.T + layer.linear.bias  # (2, 5, 6): units 0,0,1,1,2,2
    expected = torch.stack([torch.maximum(linear[..., 2 * k], linear[..., 2 * k + 1]) for k in range(3)], dim=-1)
    torch.testing.assert_close(layer(x), expected, atol=0, rtol=0)


def test_maxout_with_one_zero_piece_is_relu() -> None:
    layer = Maxout(3, 3, pool=2)
    with torch.no_grad():
        layer.linear.weight.zero_()
        layer.linear.bias.zero_()
        layer.linear.weight[0::2] = torch.eye(3)  # piece 0 of unit k is x_k, piece 1 is 0
    x = torch.randn(10, 3)
    torch.testing.assert_close(layer(x), torch.relu(x), atol=0, rtol=0)
