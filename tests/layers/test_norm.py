"""The norm a config asks for: RMSNorm against PyTorch's own module and against its formula."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from qkv.layers.norm import make_norm

TOL = 1e-6


def config(norm: str, bias: bool = False) -> SimpleNamespace:
    return SimpleNamespace(d_model=16, norm=norm, layer_norm_eps=1e-6, bias=bias)


def test_rmsnorm_matches_torch_and_the_formula() -> None:
    torch.manual_seed(0)
    ours = make_norm(config("rmsnorm"))
    with torch.no_grad():
        ours.weight.copy_(torch.randn(16))
    ref = nn.RMSNorm(16, eps=1e-6)
    ref.load_state_dict(ours.state_dict())  # the same parameter name: ``weight``, no bias
    x = torch.randn(2, 5, 16) * 3 + 1
    torch.testing.assert_close(ours(x), ref(x), atol=TOL, rtol=0)
    by_hand = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * ours.weight  # no mean taken away
    torch.testing.assert_close(ours(x), by_hand, atol=1e-5, rtol=0)
    assert [name for name, _ in ours.named_parameters()] == ["weight"]


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_is_torchs_with_or_without_bias(bias: bool) -> None:
    ours = make_norm(config("layernorm", bias))
    assert isinstance(ours, nn.LayerNorm) and (ours.bias is not None) == bias and ours.eps == 1e-6


def test_an_unknown_norm_is_refused() -> None:
    with pytest.raises(ValueError, match="norm='batchnorm'"):
        make_norm(config("batchnorm"))
