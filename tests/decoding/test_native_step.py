"""The native step (the decode step in one call to C) against the Python step in float64: the same logits and the
same cache writes for every kind of weight and every model variant it takes, the same tokens as the model's own
forward when decoding, the same numbers on one thread and two, and a clean fall back when it cannot run."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from qkv import native
from qkv.decoding import Engine, Request, SamplingParams, generate
from qkv.decoding.decode_step import gpt_step
from qkv.decoding.fast_step import fast_step_for, resolve_step
from qkv.decoding.native_step import int8_in_bfloat16, native_product
from qkv.errors import QkvError
from qkv.models import GPT, GPTConfig, LlamaConfig
from qkv.models.llama import Llama
from qkv.quantization import Int4Linear, Int8Linear, quantize_model, set_activations
from qkv.quantization.activation_blocks import round_activations
from qkv.quantization.int4_linear import bfloat16_gemm
from qkv.quantization.int8_linear import KERNEL_ROWS
from tests.decoding.test_fast_step import tiny_transformer

BLOCK = 32

MODELS = {  # every branch of the C step: norms, feed-forwards, RoPE or learned positions, biases, head widths
    "rope, gated": lambda: Llama(
        LlamaConfig(
            vocab_size=97,
            d_model=64,
            n_heads=4,
            n_kv_heads=2,
            d_ff=96,
            n_layers=2,
            context_length=48,
            tie_embeddings=True,
            init_std=0.3,
        )
    ),  # fmt: skip
    "qwen2, window": lambda: Llama(
        LlamaConfig(
            vocab_size=97,
            d_model=64,
            n_heads=4,
            n_kv_heads=1,
            d_ff=64,
            n_layers=2,
            context_length=48,
            qkv_bias=True,
            sliding_window=5,
            init_std=0.3,
        )
    ),  # fmt: skip
    "learned positions": lambda: GPT(
        GPTConfig(vocab_size=97, d_model=64, n_heads=4, d_ff=128, n_layers=2, context_length=48, init_std=0.3)
    ),  # fmt: skip
    "rope, scaled embeddings": lambda: GPT(  # W_E's rows times sqrt(d_model), looked up by the C step
        GPTConfig(
            vocab_size=97,
            d_model=64,
            n_heads=4,
            d_ff=128,
            n_layers=2,
            context_length=48,
            positional="rope",
            scale_embeddings=True,
            init_std=0.3,
        )
    ),  # fmt: skip
    "wide heads": lambda: Llama(
        LlamaConfig(
            vocab_size=97, d_model=256, n_heads=2, n_kv_heads=1, d_ff=128, n_layers=1, context_length=48, init_std=0.1
        )
    ),  # fmt: skip
}
SCHEMES = ("float32", "int8", "int8 activations", "int8 g32", "int8 activations g32", "int4", "int4 activations",
           "int8 twice", "int8 twice g32", "int4 twice")  # fmt: skip
ROUNDED = ("int8 activations", "int8 activations g32", "int4 activations", "int8 twice", "int8 twice g32",
           "int4 twice")  # fmt: skip  # the schemes that round x to int8 (once, or twice: activations int8x2)


def activations_of(kind: str) -> str:
    """The layers' activations in a scheme or kind named above: "twice" (int8x2), "activations" (int8), or float."""
    return "int8x2" if "twice" in kind else "int8" if "activations" in kind else "float"


@pytest.fixture(autouse=True)
def _library():
    if native.library() is None:
        pytest.skip(f"the C kernels are unavailable: {native.unavailable_reason()}")


def make(name: str, scheme: str) -> nn.Module:
    torch.manual_seed(3)
    model = MODELS[name]().eval()
    with torch.no_grad():  # norm gains and biases other than 1 and 0, so that one left out changes the numbers
        for param_name, p in model.named_parameters():
            if param_name.endswith(("norm.weight", "bias")):
                p.uniform_(0.5, 1.5)
    if scheme != "float32":
        if scheme.startswith("int4"):  # W_U (tied: W_E too) int8 with a scale per row; "int8 g32" has its groups
            quantize_model(model, "int4", int8_group_size=0)
        else:
            quantize_model(model, "int8", group_size=32 if "g32" in scheme else 0)
        set_activations(model, activations_of(scheme))
    return model


def rounded(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 in blocks of 32 as the C step does (float32: the same ties), back in x's dtype."""
    blocks = x.float().reshape(*x.shape[:-1], -1, BLOCK)
    top = blocks.abs().amax(-1, keepdim=True)
    levels = torch.round(blocks * torch.where(top > 0, 127 / top, torch.zeros_like(top)))
    return (levels * (top / 127)).reshape(x.shape).to(x.dtype)


def rounded_twice(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 blocks, plus what that missed (in float32, as the C step computes it) rounded alike."""
    once = rounded(x.float())
    return (once.double() + rounded(x.float() - once).double()).to(x.dtype)


class Reference(nn.Module):
    """A quantized layer's arithmetic in float64: its dequantized weights, and x rounded where the C step rounds it
    (int8 activations; for int4 its weights s q + m times the rounded x, as llama.cpp's Q4_1 x Q8_1 product; for
    int8 weights with float activations on a CPU with bfloat16 products, x in bfloat16, and with scales per group
    s Q in bfloat16 too)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer, self.weight = layer, layer.weight.double()
        self.bias = None if layer.bias is None else layer.bias.double()
        self.in_bfloat16 = isinstance(layer, Int8Linear) and int8_in_bfloat16(layer.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if self.layer.activations == "int8":
            x = rounded(x)
        elif self.layer.activations == "int8x2":
            x = rounded_twice(x)
        elif self.in_bfloat16:
            x = x.float().bfloat16().double()
            if self.layer.group_size:
                weight = self.layer.weight.float().bfloat16().double()
        y = x @ weight.T
        return y if self.bias is None else y + self.bias


def float64_reference(model: nn.Module) -> nn.Module:
    reference = copy.deepcopy(model)
    for module in list(reference.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, (Int8Linear, Int4Linear)):
                setattr(module, child_name, Reference(child))
    return reference.double()


INT8_GROUPS = ["int8 g32", "int8 g64", "int8 g96", "int8 activations g32", "int8 activations g64"]
GROUPED_WIDTH = {32: 416, 64: 384, 96: 288}  # 13 blocks of 32 (the last pair half empty), 12, and 9 in groups of 3


@pytest.mark.parametrize("rows", [1, 3, 8, 11])
@pytest.mark.parametrize(
    "kind",
    ["float32", "int8", "int8 activations", *INT8_GROUPS, "int4 g32", "int4 g128", "int4 g32 activations",
     "int4 g128 activations", "int8 twice", "int8 twice g32", "int4 g32 twice"],
)  # fmt: skip
def test_each_product_computes_the_layers_numbers(kind: str, rows: int) -> None:
    """One product of each kind, against its arithmetic in float64 (rows beyond 8 take a second pass); the
    widths leave a block of 32 and a row of 16 over, and x has one large value, as small models' do. Int8 with
    scales per group: columns of different sizes, so that each group's scale differs."""
    torch.manual_seed(0)
    group = int(kind.split("g")[-1]) if kind.startswith("int8") and " g" in kind else 0
    width = GROUPED_WIDTH[group] if group else 384
    weight, bias = torch.randn(40, width), torch.randn(40)
    if group:
        weight = weight * torch.rand(width).mul(4).exp()  # scales from 1 to e^4 across the groups
    x = torch.randn(rows, width)
    x[:, 5] = 40.0
    if kind == "float32":
        layer: nn.Module = nn.Linear(384, 40)
        layer.weight.data, layer.bias.data = weight, bias
        theirs = x.double() @ weight.double().T + bias.double()
    elif kind.startswith("int8"):
        layer = Int8Linear.from_float(weight, bias, group_size=group)
        layer.activations = activations_of(kind)
        theirs = Reference(layer)(x.double())
    else:
        layer = Int4Linear.from_float(weight, bias, group_size=int(kind.split()[1][1:]))
        layer.activations = activations_of(kind)
        theirs = Reference(layer)(x.double())
    ours = native_product(layer, x)
    assert (ours.double() - theirs).abs().max().item() <= 1e-5 * theirs.abs().max().item()


@pytest.mark.parametrize("rows", [12, 20])
@pytest.mark.parametrize("activations", ["float", "int8", "int8x2"])
def test_a_grouped_int8_layers_pytorch_forward_agrees_with_the_c_product(activations: str, rows: int) -> None:
    """A prompt (the layer's PyTorch forward) and the decode steps (the C product) round x alike and give the same
    numbers up to float32 summation order; past KERNEL_ROWS rows, where the prompt multiplies in bfloat16 on a CPU
    with bfloat16 products (as per-row int8 and int4 layers do), and where the C product multiplies float x in
    bfloat16, up to bfloat16's rounding of x and s Q."""
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(40, 416) * torch.rand(416).mul(3).exp(), torch.randn(40), group_size=32)
    layer.activations = activations
    x = torch.randn(rows, 416)
    x[:, 7] = 40.0
    with torch.no_grad():
        prompt = layer(x)
    steps = torch.cat([native_product(layer, x[i : i + 4]) for i in range(0, rows, 4)])
    if (rows > KERNEL_ROWS and bfloat16_gemm()) or (activations == "float" and int8_in_bfloat16(416)):
        inputs = x if activations == "float" else round_activations(x, activations)
        spread = torch.nn.functional.linear(inputs.abs(), layer.weight.abs())
        assert bool(((steps - prompt).abs() <= 2 * 2**-8 * spread + 1e-4).all())
    else:
        assert (steps - prompt).abs().max() <= 1e-5 * prompt.abs().max()


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_native_step_computes_the_python_steps_numbers(name: str, scheme: str) -> None:
    """The whole step against the Python step on the float64 arithmetic of the layers. Where x is rounded to
    int8 (int8 activations), an input a rounding error away from a level's edge (a few in each step of
    these random models) rounds to the neighbouring level in one and not the other, moving that value by a
    block's step and what follows by more; those schemes get a tolerance of 3%. Where x goes to bfloat16 (int8
    weights, float activations, on a CPU with bfloat16 products) the same happens at a bfloat16 step, 2^-8 of a
    value: a tolerance of 1%. Each product alone is compared exactly above."""
    model = make(name, scheme)
    reference = float64_reference(model)
    config = model.config
    cache = torch.randn(config.n_layers, 3, 2, config.n_kv_heads, 16, config.head_dim)
    tokens, positions = torch.tensor([5, 0, 96]), torch.tensor([0, 7, 15])  # rows at their own positions
    theirs_cache = cache.double()
    with torch.no_grad():
        theirs = gpt_step(reference, fast_step_for(reference).projections, tokens, positions, theirs_cache.unbind(0))
        ours = fast_step_for(model).native()(tokens, positions, cache)
    in_bfloat16 = scheme.startswith("int8") and scheme not in ROUNDED and int8_in_bfloat16(config.d_model)
    scale, tolerance = theirs.abs().max().item(), 3e-2 if scheme in ROUNDED else 1e-2 if in_bfloat16 else 2e-5
    assert (ours.double() - theirs).abs().max().item() <= tolerance * scale
    assert torch.allclose(cache.double(), theirs_cache, atol=tolerance * 10, rtol=tolerance)  # keys, values


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("scheme", ("float32", "int8 g32"))
def test_the_steps_argmax_is_torchs_of_its_logits(scheme: str, threads: int) -> None:
    """The step's own scan of the logits, part by part as the threads make them (logit_scan.h): each row's first
    largest logit, or -1 for a row with NaN or inf, whatever the threads and the rows asked for."""
    model = make("rope, gated", scheme)
    step, before = fast_step_for(model).native(), torch.get_num_threads()
    tokens, positions = torch.tensor([5, 0, 96, 7]), torch.tensor([0, 7, 15, 3])
    try:
        torch.set_num_threads(threads)
        for outputs in (None, torch.tensor([2, 0])):
            picks = torch.full((4 if outputs is None else 2,), -7, dtype=torch.long)
            logits = step(tokens, positions, torch.zeros(2, 4, 2, 2, 16, 16), outputs=outputs, argmax=picks)
            assert torch.equal(picks, logits.argmax(dim=-1))
        if scheme == "float32":  # a tie: W_U's rows 10 and 50 (in different shares of rows) alike and largest
            with torch.no_grad():
                weight = model.unembedding.weight
                weight[10] = weight[50] = 3 * weight[int(logits[1].argmax())]
            step = fast_step_for(model).native()
            picks = torch.zeros(4, dtype=torch.long)
            logits = step(tokens, positions, torch.zeros(2, 4, 2, 2, 16, 16), argmax=picks)
            assert logits[0, 10] == logits[0, 50] == logits[0].max() and picks[0] == 10
            assert torch.equal(picks, logits.argmax(dim=-1))
            with torch.no_grad():
                model.unembedding.weight[60] = torch.nan  # logit 60 of every row is NaN
            step = fast_step_for(model).native()
            picks = torch.zeros(4, dtype=torch.long)
            step(tokens, positions, torch.zeros(2, 4, 2, 2, 16, 16), argmax=picks)
            assert picks.tolist() == [-1] * 4
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="argmax must be a contiguous int64 tensor of 4 entries"):
        step(tokens, positions, torch.zeros(2, 4, 2, 2, 16, 16), argmax=torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("scheme", ("float32", "int4", "int4 activations"))
def test_any_number_of_threads_gives_the_numbers_of_one(scheme: str) -> None:
    """The threads share each matrix's rows and take what is left of each other's shares (shares.h): the step
    adds W_o a and W_2 f into x, so a row taken twice, or not at all, would change the numbers."""
    model = make("rope, gated", scheme)
    cache = torch.randn(2, 2, 2, 2, 16, 16)
    tokens, positions = torch.tensor([1, 2]), torch.tensor([3, 9])
    results = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3, 7):
            torch.set_num_threads(threads)
            c = cache.clone()
            results.append((fast_step_for(model).native()(tokens, positions, c), c))
    finally:
        torch.set_num_threads(before)
    for logits, c in results[1:]:
        assert torch.equal(results[0][0], logits) and torch.equal(results[0][1], c)


@pytest.mark.parametrize("n", [1, 5, 16, 37, 4160])
def test_the_threads_share_out_every_row_once(n: int) -> None:
    """Matrices of a row, of fewer rows than threads, of a step of 16 rows, of a step and then some, and a large
    one shared 64 rows at a time, on 1 to 9 threads (more threads than this machine has cores, so that some
    wait and the others take their rows): every row is written (none left NaN) with the numbers of one thread."""
    torch.manual_seed(0)
    layer = nn.Linear(64, n)
    x = torch.randn(3, 64)
    one = native_product(layer, x, threads=1)
    assert torch.allclose(one, layer(x), atol=1e-5)
    for threads in (2, 3, 9):
        assert torch.equal(native_product(layer, x, threads=threads), one)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_tokens_of_one_text_in_one_call_get_the_numbers_of_one_at_a_time(scheme: str) -> None:
    """Seven tokens of one text in one call (rows sharing a cache row: a prompt, or drafted tokens to check) give
    exactly the logits and cache of seven steps, and ``outputs`` picks rows' logits; a window of 5 hides the
    older keys from the later rows."""
    model = make("qwen2, window", scheme)
    config, step = model.config, fast_step_for(model).native()
    tokens, positions, slot = torch.tensor([3, 9, 14, 27, 40, 2, 5]), torch.arange(3, 10), torch.full((7,), 1)
    alone, together = (torch.randn(config.n_layers, 2, 2, config.n_kv_heads, 16, config.head_dim),) * 2
    together = together.clone()
    one_at_a_time = torch.cat([step(tokens[i : i + 1], positions[i : i + 1], alone, slot[:1]) for i in range(7)])
    assert torch.equal(step(tokens, positions, together, slot), one_at_a_time) and torch.equal(together, alone)
    last = step(tokens, positions, together.clone(), slot, outputs=torch.tensor([6, 2]))
    assert torch.equal(last, one_at_a_time[[6, 2]])
    with pytest.raises(ValueError, match="distinct positions"):
        step(tokens[:2], torch.tensor([4, 4]), together, slot[:2])


@pytest.mark.parametrize("name", ["rope, gated", "qwen2, window", "learned positions"])
def test_decoding_with_the_native_step_gives_the_models_own_tokens(name: str) -> None:
    """Greedy and sampled, rows of different lengths joining together, and past the context (the window
    refilled): the tokens of the model's own forward."""
    model = make(name, "float32")
    prompts = [[3, 4, 5], [7] * 11, [1, 2]]
    for settings in (dict(temperature=0.0), dict(temperature=0.8, top_k=20, seed=5)):
        for new in (10, 50):  # 11 + 50 tokens: past the context of 48
            params = SamplingParams(max_new_tokens=new, **settings)
            ours, theirs = (decode(model, step, prompts, params) for step in ("native", "model"))
            assert ours == theirs, (settings, new)


def decode(model: nn.Module, step: str, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """Every request's new tokens, the requests joining one engine together."""
    engine = Engine(model, len(prompts), model.config.context_length, step=step)
    requests = [Request(prompt, params) for prompt in prompts]
    made: dict[int, list[int]] = {id(r): [] for r in requests}
    outputs = engine.add(requests)
    while outputs:
        for out in outputs:
            assert out.error is None, out.error
            made[id(out.request)].append(out.token)
        outputs = engine.step()
    return [made[id(r)] for r in requests]


def test_auto_picks_the_native_step_where_it_runs_and_says_why_not_elsewhere() -> None:
    assert resolve_step(make("rope, gated", "float32")) == "native"
    assert resolve_step(make("rope, gated", "int4")) == "native"
    double = make("rope, gated", "float32").double()
    assert resolve_step(double) == "static"
    with pytest.raises(QkvError, match=r"step='native' cannot run here: .*float64.*use step='static'"):
        resolve_step(double, "native")
    with pytest.raises(QkvError, match="decoder-only"):
        resolve_step(tiny_transformer().float(), "native")
    post_ln = GPT(GPTConfig(vocab_size=20, d_model=32, n_heads=2, n_layers=1, context_length=16, norm_first=False))
    assert resolve_step(post_ln) == "static"


def test_without_a_compiler_the_step_falls_back_to_pytorch(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))  # nothing cached here
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    native.forget()
    try:
        assert native.library() is None and "no C compiler" in native.unavailable_reason()
        model = make("rope, gated", "float32")
        assert resolve_step(model) == "static"
        ours = generate(model, [[1, 2, 3]], max_new_tokens=5, temperature=0)
        assert torch.equal(ours, generate(model, [[1, 2, 3]], max_new_tokens=5, temperature=0, step="model"))
        monkeypatch.setenv("QKV_NATIVE", "0")
        native.forget()
        assert native.library() is None and "QKV_NATIVE=0" in native.unavailable_reason()
    finally:
        native.forget()


def test_the_library_is_built_once_and_loaded_from_the_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("QKV_CACHE", str(tmp_path))
    unoptimized = tuple("-O0" if flag == "-O3" else flag for flag in native.FLAGS)  # builds in 1 s, not 14
    monkeypatch.setattr(native, "FLAGS", unoptimized)
    first = native.build()
    assert first.parent == tmp_path / "native" and first.is_file()
    stamp = first.stat().st_mtime_ns
    calls = []
    real_run = native.subprocess.run
    monkeypatch.setattr(native.subprocess, "run", lambda args, **kw: calls.append(args) or real_run(args, **kw))
    assert native.build() == first and first.stat().st_mtime_ns == stamp
    assert all("--version" in args for args in calls)  # the compiler was asked its version, never to build


def test_a_compiled_step_holds_the_native_step_as_one_operator(quick_compile, monkeypatch) -> None:
    """torch.compile of the step where the native step runs: one graph, no breaks, calling
    qkv::native_decode_step, and the model's own tokens."""
    from qkv.decoding import native_step as native_module

    calls = []
    real = native_module.NativeStep.__call__

    def recorded(self, *a, **k):
        logits = real(self, *a, **k)
        calls.append((logits.argmax(-1), k.get("argmax")))
        return logits

    monkeypatch.setattr(native_module.NativeStep, "__call__", recorded)
    model = make("rope, gated", "float32")
    params = SamplingParams(max_new_tokens=12, temperature=0.0)
    assert decode(model, "compiled", [[3, 4, 5], [9, 9]], params) == decode(model, "model", [[3, 4, 5], [9, 9]], params)
    assert calls and not quick_compile["graph_break"]
    steps = [(best, picks) for best, picks in calls if picks is not None]  # the engine's steps (not the prompts)
    assert len(steps) >= 11 and all(torch.equal(best, picks) for best, picks in steps)  # the step's own argmax


def test_the_cache_key_covers_every_source_file() -> None:
    """Editing any C file the step includes builds anew: the key hashes each of them (a header left out of
    SOURCES would leave an old library loaded after an edit)."""
    folder = Path(native.__file__).parent
    assert set(native.SOURCES) == {p.name for p in folder.iterdir() if p.suffix in (".c", ".h")}


@pytest.mark.parametrize("group", [0, 32])
@pytest.mark.parametrize("choice", [0, 1])
def test_float_x_int8_rows_in_float32_or_bfloat16_as_the_cpu_is_told(choice: int, group: int) -> None:
    """Weight-only int8 rows multiply x in bfloat16 where the CPU's bfloat16 dot products pay (AMD) and in float32
    where they do not (Intel): either path, forced, gives W x with x as int8_in_bfloat16 says (float32 sums)."""
    lib = native.library()
    if lib is None:
        pytest.skip(f"the C kernels are unavailable ({native.unavailable_reason()})")
    torch.manual_seed(0)
    layer = Int8Linear.from_float(torch.randn(24, 96), torch.randn(24), group_size=group)
    x = torch.randn(3, 96)
    lib.qkv_set_int8_bf16(choice)
    try:
        in_bfloat16 = int8_in_bfloat16(96)
        y = native_product(layer, x)
    finally:
        lib.qkv_set_int8_bf16(-1)
    if choice == 1 and not in_bfloat16:
        pytest.skip("this CPU has no AVX512_BF16: its int8 rows always multiply x in float32")
    assert in_bfloat16 == (choice == 1)
    weight = layer.weight.double()
    if in_bfloat16:  # with groups, s Q is rounded to bfloat16 too
        x = x.bfloat16()
        weight = weight.bfloat16() if group else weight
    reference = torch.nn.functional.linear(x.double(), weight.double(), layer.bias.double())
    assert (y.double() - reference).abs().max() <= 1e-5 * reference.abs().max()
