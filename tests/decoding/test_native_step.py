"""The native step (the decode step in one call to C) against the Python step in float64: the same logits and the
same cache writes for every kind of weight and every model variant it takes, the same tokens as the model's own
forward when decoding, the same numbers on one thread and two, and a clean fall back when it cannot run.
Each product alone is checked in tests/decoding/test_native_step_products.py; the models, schemes and float64
reference are tests/decoding/native_reference.py's."""

from __future__ import annotations

import ctypes
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from torch import nn

from qkv import native
from qkv.decoding import Engine, Request, SamplingParams, generate
from qkv.decoding.decode_step import gpt_step
from qkv.decoding.fast_step import fast_step_for, resolve_step
from qkv.decoding.native_step import int8_in_bfloat16
from qkv.errors import QkvError
from qkv.models import GPT, GPTConfig
from tests.decoding.native_reference import (  # noqa: F401 (_library: the autouse fixture)
    MODELS,
    ROUNDED,
    SCHEMES,
    _library,
    float64_reference,
    make,
)
from tests.decoding.test_fast_step import tiny_transformer

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)


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


def small_sources(monkeypatch, tmp_path) -> None:  # noqa: ANN001
    """A one-function library in place of qkv's sources (which take 20 s to compile even at -O0)."""
    monkeypatch.setenv("QKV_CACHE", str(tmp_path / "cache"))
    (tmp_path / "decode_step.c").write_text("int qkv_answer(void) { return 42; }\n")
    monkeypatch.setattr(native, "HERE", tmp_path)
    monkeypatch.setattr(native, "SOURCES", ("decode_step.c",))


def test_the_library_is_built_once_and_loaded_from_the_cache(monkeypatch, tmp_path) -> None:
    small_sources(monkeypatch, tmp_path)
    first = native.build()
    assert ctypes.CDLL(str(first)).qkv_answer() == 42
    assert first.parent == tmp_path / "cache" / "native" and first.is_file()
    stamp = first.stat().st_mtime_ns
    calls = []
    real_run = native.subprocess.run
    monkeypatch.setattr(native.subprocess, "run", lambda args, **kw: calls.append(args) or real_run(args, **kw))
    assert native.build() == first and first.stat().st_mtime_ns == stamp
    assert all("--version" in args for args in calls)  # the compiler was asked its version, never to build


def test_processes_building_at_once_compile_once(monkeypatch, tmp_path) -> None:
    """Two builders at once (threads here: each holds its own lock file handle, as processes do): one compiles,
    the other waits for it and takes its library."""
    small_sources(monkeypatch, tmp_path)
    compiles = []
    real_run = native.subprocess.run

    def run(args, **kw):  # noqa: ANN001, ANN003, ANN202
        if "--version" not in args:
            compiles.append(args)
            time.sleep(0.5)  # long enough for the second builder to arrive while the first compiles
        return real_run(args, **kw)

    monkeypatch.setattr(native.subprocess, "run", run)
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: native.build(), range(2)))
    assert paths[0] == paths[1] and paths[0].is_file() and len(compiles) == 1


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
