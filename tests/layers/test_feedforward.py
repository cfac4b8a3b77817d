"""The gated feed-forward (GLU variants, Shazeer 2020) against its formula written out by hand."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.layers.feedforward import FeedForward, GatedFeedForward

TOL = 1e-5


@pytest.mark.parametrize(("activation", "act"), [("silu", F.silu), ("gelu", F.gelu)])
@pytest.mark.parametrize("bias", [False, True])
def test_gated_feed_forward_is_w2_of_act_gate_times_w1(activation: str, act, bias: bool) -> None:
    torch.manual_seed(0)
    ffn = GatedFeedForward(12, 20, activation=activation, bias=bias)
    x = torch.randn(3, 4, 12)
    w_g, w_1, w_2 = ffn.gate.weight, ffn.linear1.weight, ffn.linear2.weight  # (20, 12), (20, 12), (12, 20)
    b = (ffn.gate.bias, ffn.linear1.bias, ffn.linear2.bias) if bias else (0.0, 0.0, 0.0)
    expected = (act(x @ w_g.T + b[0]) * (x @ w_1.T + b[1])) @ w_2.T + b[2]
    torch.testing.assert_close(ffn(x), expected, atol=TOL, rtol=0)
    names = {name for name, _ in ffn.named_parameters()}
    assert {"gate.weight", "linear1.weight", "linear2.weight"} <= names and len(names) == (6 if bias else 3)


def test_the_gate_matters_and_the_plain_mlp_is_unchanged() -> None:
    torch.manual_seed(0)
    gated, plain = GatedFeedForward(8, 16), FeedForward(8, 16, activation="silu")
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    x = torch.randn(2, 3, 8)
    assert not torch.allclose(gated(x), plain(x))
    with torch.no_grad():  # a zero gate: silu(0) = 0 shuts every unit, leaving W_2's bias
        gated.gate.weight.zero_()
        gated.gate.bias.zero_()
    torch.testing.assert_close(gated(x), plain.linear2.bias.expand(2, 3, 8), atol=TOL, rtol=0)
