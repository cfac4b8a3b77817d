"""The decoding engine's batched products: inside ``onednn_rows`` a few vectors go through oneDNN's linear on its
packed copy of the weight, with F.linear's numbers; the copy follows the weight; outside it nothing changes;
and a batch decodes the same greedy tokens as the reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.decoding import generate
from qkv.layers import linear as linear_module
from qkv.layers.linear import linear, onednn_rows
from qkv.models import GPT, GPTConfig

needs_onednn = pytest.mark.skipif(not linear_module._onednn_linear(), reason="needs torch's oneDNN (CPU)")


@pytest.fixture(autouse=True)
def _two_threads():
    """The block path runs with 2 or more threads; an earlier test may have left torch at one (qkv's default
    picks one thread per idle core), so set two here and restore the count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def spy_onednn(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    original = torch.ops.mkldnn._linear_pointwise

    def recording(x, *args):
        calls.append(tuple(x.shape))
        return original(x, *args)

    monkeypatch.setattr(linear_module.torch.ops.mkldnn, "_linear_pointwise", recording)
    return calls


@needs_onednn
@pytest.mark.parametrize("leading", [(2,), (8,), (2, 8), (16,)])
@pytest.mark.parametrize("bias", [True, False])
def test_a_few_rows_inside_the_block_equal_f_linear(monkeypatch, leading, bias) -> None:
    calls = spy_onednn(monkeypatch)
    torch.manual_seed(0)
    weight, b = torch.randn(1030, 256), torch.randn(1030) if bias else None
    x = torch.randn(*leading, 256)
    with torch.no_grad(), onednn_rows():
        out = linear(x, weight, b)
    rows = x.numel() // 256
    assert calls == [(4 if rows == 2 else rows, 256)]  # two rows go through as four
    assert out.shape == (*leading, 1030)
    torch.testing.assert_close(out, F.linear(x, weight, b), atol=1e-4, rtol=1e-5)


@needs_onednn
def test_one_row_many_rows_and_outside_the_block_keep_their_paths(monkeypatch) -> None:
    calls = spy_onednn(monkeypatch)
    weight = torch.randn(1024, 256)
    with torch.no_grad():
        linear(torch.randn(8, 256), weight)  # outside: the batched path as before
        with onednn_rows():
            linear(torch.randn(1, 256), weight)  # one vector: the batched path reads the matrix fastest
            linear(torch.randn(257, 256), weight)  # beyond BATCH_ROWS: BLAS
            linear(torch.randn(8, 16), torch.randn(8, 16))  # a small matrix: BLAS
    assert calls == []


@needs_onednn
def test_the_packed_copy_is_made_once_and_again_after_an_in_place_change() -> None:
    torch.manual_seed(0)
    weight, x = torch.nn.Parameter(torch.randn(1024, 256)), torch.randn(4, 256)
    with torch.no_grad(), onednn_rows():
        first = linear_module.packed_weight(weight)
        assert linear_module.packed_weight(weight) is first  # kept
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight), atol=1e-4, rtol=1e-5)
        weight.mul_(-2.0)  # a training step: the next product must see the new numbers
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight), atol=1e-4, rtol=1e-5)
        assert linear_module.packed_weight(weight) is not first
        weight.data = torch.randn(1024, 256)  # new storage, as module.float() gives: the version does not move
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight), atol=1e-4, rtol=1e-5)
    with torch.inference_mode():  # a weight made in inference mode has no version counter to follow
        frozen = torch.randn(1024, 256)
    with torch.no_grad(), onednn_rows():
        torch.testing.assert_close(linear(x, frozen), F.linear(x, frozen), atol=1e-4, rtol=1e-5)
    key = (id(weight), "packed")
    assert key in linear_module._packed
    del weight
    assert key not in linear_module._packed  # the copy goes with its weight


@needs_onednn
def test_without_packed_copies_the_plain_matrix_is_multiplied(monkeypatch) -> None:
    seen: list[torch.Tensor] = []
    original = torch.ops.mkldnn._linear_pointwise

    def recording(x, matrix, *args):
        seen.append(matrix)
        return original(x, matrix, *args)

    monkeypatch.setattr(linear_module.torch.ops.mkldnn, "_linear_pointwise", recording)
    weight, x = torch.randn(1024, 256), torch.randn(4, 256)
    try:
        with torch.no_grad(), onednn_rows():
            linear(x, weight)
            linear_module.use_packed_weights(False)
            assert not linear_module._packed  # the copies made so far are freed
            torch.testing.assert_close(linear(x, weight), F.linear(x, weight), atol=1e-4, rtol=1e-5)
    finally:
        linear_module.use_packed_weights(True)
    assert seen[0] is not weight and seen[1] is weight


def test_batched_greedy_tokens_equal_the_models_own_forward() -> None:
    torch.manual_seed(0)  # d_model 256: W_1 (1024, 256) is large enough for the batched products
    model = GPT(GPTConfig(vocab_size=300, n_layers=2, d_model=256, n_heads=4, context_length=64)).eval()
    prompt = torch.randint(0, 300, (6, 7))
    fast = generate(model, prompt, max_new_tokens=12, temperature=0.0)
    assert torch.equal(fast, generate(model, prompt, max_new_tokens=12, temperature=0.0, step="model"))
