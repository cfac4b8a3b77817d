"""fuse_linears: one product equal to the projections run one by one, and a fallback for other module types."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv.layers.fused import ConcatenatedProjections, fuse_linears
from qkv.layers.linear import Linear


class PackedLinear(nn.Module):
    """A stand-in for a quantized linear: same call signature, no float ``.weight`` attribute."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("packed", layer.weight.detach().clone())
        self.register_buffer("offset", layer.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.packed, self.offset)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", [Linear, nn.Linear])
def test_stacked_product_equals_the_projections_one_by_one(kind: type[nn.Linear], bias: bool) -> None:
    torch.manual_seed(0)
    layers = [kind(24, n, bias=bias).double() for n in (24, 24, 16)]
    fused = fuse_linears(*layers)
    assert isinstance(fused, Linear) and fused.weight.shape == (64, 24)
    x = torch.randn(5, 3, 24, dtype=torch.float64)
    torch.testing.assert_close(fused(x), torch.cat([layer(x) for layer in layers], dim=-1), atol=1e-12, rtol=0)
    assert not any(p.requires_grad for p in fused.parameters())


def test_the_stack_is_a_copy_made_once() -> None:
    layers = [Linear(8, 8) for _ in range(3)]
    fused = fuse_linears(*layers)
    with torch.no_grad():
        layers[0].weight.zero_()
    assert fused.weight[:8].abs().sum() > 0  # the engine rebuilds it when the model's weights change


def test_other_module_types_are_called_one_by_one() -> None:
    torch.manual_seed(0)
    layers = [Linear(8, 8) for _ in range(3)]
    packed = [PackedLinear(layer) for layer in layers]
    x = torch.randn(2, 8)
    expected = torch.cat([layer(x) for layer in layers], dim=-1)
    for modules in (packed, [layers[0], packed[1], layers[2]]):  # all replaced, or some
        fused = fuse_linears(*modules)
        assert isinstance(fused, ConcatenatedProjections)
        torch.testing.assert_close(fused(x), expected)


def test_a_module_type_can_register_its_own_rule() -> None:
    calls: list[int] = []

    class Registered(PackedLinear):
        pass

    @fuse_linears.register(Registered)
    def _(first: Registered, *others: nn.Module) -> nn.Module:
        calls.append(1 + len(others))
        return ConcatenatedProjections((first, *others))

    layers = [Registered(Linear(4, 4)) for _ in range(3)]
    fuse_linears(*layers)
    assert calls == [3]
