"""The decoding path of linear(): the same numbers as F.linear, whichever way the product is cut."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.layers import linear as linear_module
from qkv.layers.linear import LARGE_MATRIX, Linear, linear


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def spy(monkeypatch) -> list[str]:
    """Record the batched products linear() runs (its split path), still computing them."""
    calls: list[str] = []
    for name in ("bmm", "baddbmm"):
        original = getattr(torch, name)
        monkeypatch.setattr(
            linear_module.torch, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
        )
    return calls


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("n_out", [1024, 1027])  # divisible by the blocks, and with rows left over
@pytest.mark.parametrize("leading", [(1, 1), (1, 3), (8, 1), (2, 8)])
@pytest.mark.parametrize("bias", [True, False])
def test_split_product_equals_f_linear(threads, monkeypatch, n_threads, n_out, leading, bias) -> None:
    threads(n_threads)
    monkeypatch.setattr(linear_module, "MKL_ON_INTEL", False)  # one vector too takes the split path
    calls = spy(monkeypatch)
    torch.manual_seed(0)
    weight = torch.randn(n_out, 256)
    b = torch.randn(n_out) if bias else None
    x = torch.randn(*leading, 256)
    with torch.no_grad():
        out = linear(x, weight, b)
    torch.testing.assert_close(out, F.linear(x, weight, b), atol=1e-4, rtol=1e-5)
    assert out.shape == (*leading, n_out)
    assert calls, "the split path was taken"


def test_the_split_path_is_only_for_few_vectors_without_gradients(threads, monkeypatch) -> None:
    threads(2)
    taken = spy(monkeypatch)
    weight, b = torch.randn(LARGE_MATRIX // 256, 256), torch.zeros(LARGE_MATRIX // 256)
    with torch.no_grad():
        linear(torch.randn(1, 17, 256), weight, b)  # too many vectors: arithmetic-bound, F.linear
        linear(torch.randn(1, 256), weight[:8], b[:8])  # too small a matrix: stays in cache
    linear(torch.randn(1, 256), weight, b)  # gradients on: training keeps F.linear
    threads(1)
    with torch.no_grad():
        linear(torch.randn(1, 256), weight, b)  # one thread: nothing to split across
    assert not taken


@pytest.mark.parametrize("mkl_on_intel", [True, False])
def test_one_vector_goes_to_mkls_kernel_on_intel_and_the_split_path_elsewhere(
    threads, monkeypatch, mkl_on_intel
) -> None:
    threads(2)
    monkeypatch.setattr(linear_module, "MKL_ON_INTEL", mkl_on_intel)
    taken = spy(monkeypatch)
    weight, b, x = torch.randn(1027, 256), torch.randn(1027), torch.randn(1, 1, 256)
    with torch.no_grad():
        out = linear(x, weight, b)
        linear(torch.randn(2, 256), weight, b)  # two vectors: the split path on any CPU
    torch.testing.assert_close(out, F.linear(x, weight, b), atol=1e-4, rtol=1e-5)
    assert taken.count("baddbmm") == (1 if mkl_on_intel else 2)


def test_mkl_on_intel_is_read_from_the_cpus_vendor(monkeypatch, tmp_path) -> None:
    import builtins

    for vendor, expected in (("GenuineIntel", True), ("AuthenticAMD", False)):
        info = tmp_path / vendor
        info.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\nflags\t\t: fpu\n")
        real_open = builtins.open
        monkeypatch.setattr(
            builtins,
            "open",
            lambda path, *a, _i=info, _o=real_open, **k: _o(_i if path == "/proc/cpuinfo" else path, *a, **k),
        )
        monkeypatch.setattr(linear_module.torch.backends.mkl, "is_available", lambda: True)
        assert linear_module._mkl_on_intel() is expected
        monkeypatch.setattr(linear_module.torch.backends.mkl, "is_available", lambda: False)
        assert linear_module._mkl_on_intel() is False
        monkeypatch.setattr(builtins, "open", real_open)


def test_linear_module_keeps_nn_linear_names_and_gradients() -> None:
    layer = Linear(8, 4)
    assert isinstance(layer, torch.nn.Linear) and set(layer.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 8)
    layer(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(4, 1) * x.sum(0))


@pytest.mark.parametrize("bias", [True, False])
def test_a_frozen_matrix_under_training_multiplies_from_its_packed_copy(monkeypatch, bias: bool) -> None:
    """LoRA's base: rows that take a gradient times a frozen W go through oneDNN's packed copy, and dL/dx through
    a packed copy of W^T; the output and dL/dx are F.linear's, and W takes no gradient."""
    if not linear_module._onednn_linear():
        pytest.skip("this torch has no oneDNN linear")
    calls, packed_product = [], linear_module.packed_product
    monkeypatch.setattr(linear_module, "packed_product", lambda *a: calls.append(1) or packed_product(*a))
    backward, transposed = [], linear_module.packed_transposed_product
    monkeypatch.setattr(linear_module, "packed_transposed_product", lambda *a: backward.append(1) or transposed(*a))
    weight = torch.randn(48, 64)
    b = torch.randn(48) if bias else None
    x = torch.randn(3, 20, 64, requires_grad=True)
    out = linear(x, weight, b)
    (out * torch.linspace(-1, 1, 48)).sum().backward()
    assert calls and backward and weight.grad is None
    x_ref = x.detach().clone().requires_grad_(True)
    reference = F.linear(x_ref, weight, b)
    (reference * torch.linspace(-1, 1, 48)).sum().backward()
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    copy = linear_module.packed_transpose(weight)
    assert linear_module.packed_transpose(weight) is copy  # made once
    weight.mul_(2)  # changed in place: a new copy, and the new dL/dx
    assert linear_module.packed_transpose(weight) is not copy
    x.grad = None
    (linear(x, weight, b) * torch.linspace(-1, 1, 48)).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x_ref.grad, atol=1e-5, rtol=1e-5)
    calls.clear()
    linear(x, weight.clone().requires_grad_(True), b)  # a trained matrix: the plain product
    assert not calls


@pytest.mark.parametrize("bias", [True, False])
def test_a_frozen_matrix_under_bfloat16_autocast_multiplies_a_bfloat16_copy_made_once(monkeypatch, bias: bool) -> None:
    """Under CPU autocast (bfloat16), a frozen W's products are autocast's own (F.linear's numbers and dtype, and
    dL/dx), taken from one bfloat16 copy of W kept while W is unchanged, not a cast at every product."""
    if not linear_module._onednn_linear():
        pytest.skip("this torch has no oneDNN linear")
    calls, copies = [], linear_module.bfloat16_weight
    monkeypatch.setattr(linear_module, "bfloat16_weight", lambda w: calls.append(1) or copies(w))
    torch.manual_seed(0)
    weight, b = torch.randn(48, 64), (torch.randn(48) if bias else None)
    x = torch.randn(3, 20, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    scale = torch.linspace(-1, 1, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x, weight, b)
        reference = F.linear(x_ref, weight, b)
    (out.float() * scale).sum().backward()
    (reference.float() * scale).sum().backward()
    assert calls and out.dtype == reference.dtype == torch.bfloat16
    assert weight.grad is None and x.grad.dtype == torch.float32
    torch.testing.assert_close(out, reference, atol=2e-2, rtol=1e-2)  # a bfloat16 step
    torch.testing.assert_close(x.grad, x_ref.grad, atol=2e-2, rtol=1e-2)
    copy = linear_module.bfloat16_weight(weight)
    assert linear_module.bfloat16_weight(weight) is copy and torch.equal(copy, weight.bfloat16())
    weight.mul_(2)  # changed in place: a new copy
    assert torch.equal(linear_module.bfloat16_weight(weight), weight.bfloat16())


def test_the_thread_count_is_marked_constant_as_torch_compilers_decorator_marks() -> None:
    """linear's thread count carries the mark that torch.compiler.assume_constant_result sets (set by hand so that
    importing qkv does not import Dynamo): if PyTorch's decorator ever marks differently, this fails."""
    marked = torch.compiler.assume_constant_result(lambda: 0)
    added = {name: value for name, value in vars(marked).items() if not name.startswith("__")}
    assert added, "the decorator no longer marks the function: linear's _threads needs another way"
    assert {name: getattr(linear_module._threads, name, None) for name in added} == added
