"""The C step's own embedding lookup (W_E's row, plus a positional table's) and its activations, against PyTorch's
numbers: the parts of the step around the products (tests/decoding/test_native_step.py and
test_native_step_products.py have the rest)."""

from __future__ import annotations

import pytest
import torch

from qkv.decoding.decode_step import gpt_step
from qkv.decoding.fast_step import fast_step_for
from qkv.models import GPT, GPTConfig
from qkv.models.config import ACTIVATIONS
from tests.decoding.native_reference import _library, float64_reference, make  # noqa: F401 (the autouse fixture)


def step_error(model: GPT, head_dim: int, positions: tuple[int, int]) -> float:
    """The C step's largest difference from the Python step on the float64 arithmetic, relative to the largest
    logit, for two rows (tokens 5 and 60) at ``positions`` over a random cache of 16 positions."""
    reference = float64_reference(model)  # before the native step: a model holding one cannot be copied
    cache = torch.randn(1, 2, 2, 2, 16, head_dim)
    tokens, at = torch.tensor([5, 60]), torch.tensor(positions)
    with torch.no_grad():
        theirs = gpt_step(reference, fast_step_for(reference).projections, tokens, at, cache.double().unbind(0))
        ours = fast_step_for(model).native()(tokens, at, cache)
    return (ours.double() - theirs).abs().max().item() / theirs.abs().max().item()


@pytest.mark.parametrize("feed_forward", ["mlp", "glu"])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_in_the_c_step_is_pytorchs(activation: str, feed_forward: str) -> None:
    """SiLU and both GELUs are computed 16 at a time in C (sigmoid by exp_lanes, erf by a polynomial); the rest one
    at a time. Weights of std 1 put the activations' inputs far into both tails (|v| up to ~20), and a width of 72
    leaves a part-filled vector at the end of each row. The float32 step keeps within float32's rounding."""
    torch.manual_seed(5)
    config = GPTConfig(
        vocab_size=61, d_model=32, n_heads=2, d_ff=72, n_layers=1, context_length=16, positional="rope",
        activation=activation, feed_forward=feed_forward, init_std=1.0,
    )  # fmt: skip
    assert step_error(GPT(config).eval(), 16, (0, 9)) <= 2e-6  # seen: 1.7-3.5e-7


def test_the_c_step_looks_the_tokens_up_and_adds_a_positional_tables_row() -> None:
    """W_E's rows (float32, or the tied int8 matrix per row or in groups) are read by the C step itself, plus the
    row of a learned or sinusoidal positional table; the numbers are the test above's. Here, who does it, and
    the ids and positions the tables lack, refused before C reads past them."""
    for name in ("rope, gated", "rope, scaled embeddings", "learned positions"):
        for scheme in ("float32", "int8", "int8 g32", "int4"):
            step = fast_step_for(make(name, scheme)).native()
            assert bool(step.struct.embed.n), (name, scheme)
            assert bool(step.struct.positions) == (name == "learned positions"), (name, scheme)
    step = fast_step_for(make("rope, gated", "int8")).native()
    cache = torch.zeros(2, 1, 2, 2, 16, 16)
    for bad in (97, -1):
        with pytest.raises(IndexError, match=r"token ids \[\d+, -?\d+\] are not all in the vocabulary of 97"):
            step(torch.tensor([3, bad]), torch.tensor([0, 0]), cache.expand(2, 2, 2, 2, 16, 16).contiguous())
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, d_model=32, n_heads=2, n_layers=1, context_length=8)).eval()
    step = fast_step_for(model).native()
    with pytest.raises(ValueError, match=r"positions \[3, 8\] or slots .* do not fit"):  # 8 positions: 0 .. 7
        step(torch.tensor([1, 2]), torch.tensor([3, 8]), torch.zeros(1, 2, 2, 2, 64, 16))


@pytest.mark.parametrize("positional", ["learned", "sinusoidal"])
def test_a_positional_tables_row_is_added_in_c_as_pytorch_adds_it(positional: str) -> None:
    torch.manual_seed(1)
    config = GPTConfig(vocab_size=61, d_model=32, n_heads=2, n_layers=1, context_length=16, positional=positional,
                       scale_embeddings=True, init_std=0.5)  # fmt: skip
    model = GPT(config).eval()
    if positional == "learned":  # rows other than zeros
        torch.nn.init.normal_(model.embedding.positional_encoding.weight)
    assert step_error(model, 16, (3, 15)) <= 2e-6
    assert fast_step_for(model).native().struct.positions  # added in C


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_a_width_that_is_not_a_multiple_of_16_is_normed_to_its_last_value(norm: str) -> None:
    """The norms sum 16 values at a time, then the rest one by one: a width of 40 leaves 8 of them."""
    torch.manual_seed(2)
    config = GPTConfig(vocab_size=61, d_model=40, n_heads=2, n_layers=1, context_length=16, positional="rope",
                       norm=norm, init_std=0.5)  # fmt: skip
    model = GPT(config).eval()
    with torch.no_grad():
        for param_name, p in model.named_parameters():  # gains and biases other than 1 and 0
            if param_name.endswith(("norm.weight", "bias")):
                p.uniform_(0.5, 1.5)
    assert step_error(model, 20, (3, 15)) <= 2e-6
