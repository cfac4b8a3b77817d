"""The decoding engines give the reference's tokens (the model's own forward with its KV cache, and no cache at
all), compile to one graph with no breaks for every position, follow weight changes, keep working when the
model's Linear modules are replaced by other modules, and run CUDA graphs where there is CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv import GPT
from qkv.decoding import Engine, Request, SamplingParams, beam_search, generate, greedy_decode, stream
from qkv.decoding import fast_step as engine_module
from qkv.decoding.fast_step import fast_step_for, resolve_step
from qkv.decoding.translator import Translator
from qkv.errors import QkvError
from qkv.layers.capture import capture
from qkv.layers.linear import Linear
from qkv.models import Transformer, TransformerConfig
from qkv.tokenizers import CharTokenizer
from tests.conftest import tiny_gpt

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread is fastest (tests/conftest.py)


def tiny_transformer(**variant) -> Transformer:
    torch.manual_seed(2)
    config = TransformerConfig(
        **{"src_vocab_size": 30, "tgt_vocab_size": 20, **variant},
        d_model=32,
        n_heads=4,
        d_ff=64,
        n_encoder_layers=2,
        n_decoder_layers=2,
        context_length=32,
        init_std=0.4,
    )
    return Transformer(config).double().eval()


def sources() -> tuple[torch.Tensor, torch.Tensor]:
    lengths = (7, 2, 5)
    src = torch.randint(3, 30, (3, 7), generator=torch.Generator().manual_seed(3))
    padding = torch.arange(7)[None] >= torch.tensor(lengths)[:, None]
    return src.masked_fill(padding, 0), padding


def _generate_all(model: GPT, engine: str, prompt: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    """Greedy and two seeded samplings, one within the context and one past it."""
    outs = []
    for new, sampling in ((20, dict(temperature=0)), (20, dict(temperature=0.9, top_k=10)), (45, dict(top_p=0.9))):
        generator = torch.Generator().manual_seed(7)
        outs.append(generate(model, prompt, max_new_tokens=new, step=engine, generator=generator, **sampling))
    return outs


def _assert_same(outs: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for out, ref in zip(outs, expected, strict=True):
        assert torch.equal(out, ref)


@pytest.mark.parametrize(
    "variant",
    [dict(), dict(positional="rope", norm_first=False), dict(positional="sinusoidal", bias=False)],
)
def test_static_engine_generates_the_reference_tokens(variant: dict) -> None:
    model = tiny_gpt(**variant)
    prompt = torch.randint(50, (2, 4), generator=torch.Generator().manual_seed(0))
    reference = _generate_all(model, "model", prompt)
    _assert_same(_generate_all(model, "static", prompt), reference)
    _assert_same(_generate_all(model, "auto", prompt), reference)
    uncached = generate(model, prompt, max_new_tokens=20, temperature=0, use_cache=False)
    assert torch.equal(reference[0], uncached)


def test_float32_static_engine_generates_the_reference_tokens() -> None:
    model = tiny_gpt(dtype=torch.float32)
    prompt = torch.randint(50, (3, 6), generator=torch.Generator().manual_seed(1))
    _assert_same(_generate_all(model, "static", prompt), _generate_all(model, "model", prompt))


def test_compiled_gpt_step_is_one_graph_without_breaks_and_gives_the_reference_tokens(quick_compile) -> None:
    model = tiny_gpt(positional="rope")
    prompt = torch.randint(50, (2, 4), generator=torch.Generator().manual_seed(0))
    engine = Engine(model, 2, 32, step="compiled")
    engine.add([Request(row.tolist(), SamplingParams(max_new_tokens=21, temperature=0)) for row in prompt])
    for _ in range(20):  # the positions grow; the graph stays
        engine.step()
    assert not quick_compile["graph_break"]
    assert quick_compile["stats"]["unique_graphs"] == 1
    for sampling in (dict(temperature=0), dict(temperature=0.9, top_k=10)):
        outs = [
            generate(model, prompt, max_new_tokens=20, step=e, generator=torch.Generator().manual_seed(7), **sampling)
            for e in ("compiled", "model")
        ]
        assert torch.equal(*outs)
    assert not quick_compile["graph_break"]
    assert quick_compile["stats"]["unique_graphs"] == 1  # 4 + 20 tokens: the same cache size (32) as above


def test_the_compiled_steps_first_call_is_timed_as_its_compiling(quick_compile) -> None:
    from qkv.decoding.fast_step import fast_step_for

    model = tiny_gpt(positional="rope")
    fast = fast_step_for(model)
    assert fast.compile_seconds == 0.0
    engine = Engine(model, 1, 16, step="compiled")
    engine.add([Request([3, 4, 5], SamplingParams(max_new_tokens=4, temperature=0))])
    engine.step()
    spent = fast.compile_seconds
    assert spent > 0 and quick_compile["stats"]["unique_graphs"] == 1
    for _ in range(2):
        engine.step()
    assert fast.compile_seconds == spent  # later calls go to the graph itself, untimed
    assert fast.compiled() is fast.compiled()


def test_compiled_translation_is_one_graph_per_shape_and_gives_the_reference(quick_compile) -> None:
    model = tiny_transformer(norm_first=False, positional="sinusoidal", scale_embeddings=True)
    src, padding = sources()
    common = dict(bos_id=1, eos_id=2, max_len_b=20)
    expected = greedy_decode(model, src, padding, step="model", **common)
    assert greedy_decode(model, src, padding, step="compiled", **common) == expected
    assert quick_compile["stats"]["unique_graphs"] == 1  # the same graph for every step
    expected_beams = beam_search(model, src, padding, step="model", beam_size=3, n_best=3, **common)
    beams = beam_search(model, src, padding, step="compiled", beam_size=3, n_best=3, **common)
    assert [[h.tokens for h in hyps] for hyps in beams] == [[h.tokens for h in hyps] for hyps in expected_beams]
    assert quick_compile["stats"]["unique_graphs"] == 2  # and one for 3 x 3 beams
    assert not quick_compile["graph_break"]


@pytest.mark.parametrize("variant", [dict(), dict(positional="rope", final_logits_bias=True)])
def test_static_translation_equals_the_reference_greedy_and_beam(variant: dict) -> None:
    model = tiny_transformer(**variant)
    src, padding = sources()
    common = dict(bos_id=1, eos_id=2, max_len_b=20)
    assert greedy_decode(model, src, padding, step="static", **common) == greedy_decode(
        model, src, padding, step="model", **common
    )
    for beam_size in (2, 4):
        ours = beam_search(model, src, padding, step="static", beam_size=beam_size, n_best=2, **common)
        ref = beam_search(model, src, padding, step="model", beam_size=beam_size, n_best=2, **common)
        for hyps, ref_hyps in zip(ours, ref, strict=True):
            assert [h.tokens for h in hyps] == [h.tokens for h in ref_hyps]
            assert [h.score for h in hyps] == pytest.approx([h.score for h in ref_hyps], abs=1e-9)


def test_the_translator_takes_an_engine() -> None:
    tokenizer = CharTokenizer.train("abcdefghijklmnop ")
    model = tiny_transformer(src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size)
    texts = ["abc", "ponm lk"]
    outs = {e: Translator(model, tokenizer, step=e).translate(texts, beam=2) for e in ("model", "static")}
    assert outs["static"] == outs["model"]
    with pytest.raises(QkvError, match="step='fast' is unknown"):
        Translator(model, tokenizer, step="fast")


class PackedLinear(nn.Module):
    """A stand-in for the int8 linear another module will bring: same call, weights under other names."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("packed", layer.weight.detach().clone())
        self.register_buffer("offset", None if layer.bias is None else layer.bias.detach().clone())
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return F.linear(x, self.packed, self.offset)


def _replace_linears(module: nn.Module) -> list[PackedLinear]:
    replaced = []
    for name, child in module.named_children():
        if isinstance(child, Linear):
            packed = PackedLinear(child)
            setattr(module, name, packed)
            replaced.append(packed)
        else:
            replaced += _replace_linears(child)
    return replaced


def test_the_fast_step_calls_modules_that_replace_linear() -> None:
    model = tiny_gpt()
    prompt = torch.randint(50, (2, 4), generator=torch.Generator().manual_seed(0))
    expected = _generate_all(model, "model", prompt)
    replaced = _replace_linears(model)
    assert len(replaced) == 2 * 6 and not any(isinstance(m, Linear) for m in model.modules())
    _assert_same(_generate_all(model, "static", prompt), expected)
    assert all(m.calls > 20 for m in replaced)  # every replaced projection ran in the decode steps


def test_the_engine_is_rebuilt_when_the_weights_change() -> None:
    model = tiny_gpt()
    prompt = torch.randint(50, (1, 4), generator=torch.Generator().manual_seed(0))
    generate(model, prompt, max_new_tokens=5, temperature=0, step="static")
    first = fast_step_for(model)
    assert fast_step_for(model) is first
    with torch.no_grad():
        for block in model.decoder.blocks:
            block.self_attn.key.weight.mul_(-2.0)  # what an optimizer step does: in place
    assert fast_step_for(model) is not first
    assert torch.equal(
        generate(model, prompt, max_new_tokens=20, temperature=0, step="static"),
        generate(model, prompt, max_new_tokens=20, temperature=0, step="model"),
    )


def test_interleaved_streams_each_keep_their_own_cache() -> None:
    """The server streams several generations from one model at once, each step on whichever thread."""
    model = tiny_gpt()
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    alone = [list(stream(model, p, max_new_tokens=12, temperature=0)) for p in prompts]
    streams = [stream(model, p, max_new_tokens=12, temperature=0) for p in prompts]
    together: list[list[int]] = [[], []]
    for _ in range(12):
        for i, s in enumerate(streams):
            together[i].append(next(s))
    assert together == alone


def test_capturing_activations_runs_the_models_own_forward() -> None:
    model = tiny_gpt()
    assert resolve_step(model, "auto") == "static"
    with capture(model) as acts:
        assert resolve_step(model, "auto") == "model"
        generate(model, [1, 2, 3], max_new_tokens=3, temperature=0)
    assert acts["decoder.blocks.0.self_attn.q"].shape == (1, 4, 1, 8)  # the last step's query


def test_models_that_are_not_qkv_transformers_use_their_own_forward() -> None:
    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)

    assert resolve_step(Wrapper(), "auto") == "model"
    assert resolve_step(Wrapper(), "static") == "model"


def test_bad_engines_are_one_clear_error() -> None:
    model = tiny_gpt()
    with pytest.raises(QkvError, match="step='turbo' is unknown: choose one of auto, model"):
        generate(model, [1, 2], max_new_tokens=2, step="turbo")
    with pytest.raises(QkvError, match="replays CUDA graphs, but the model is on cpu"):
        stream(model, [1, 2], max_new_tokens=2, step="graph")
    src, padding = sources()
    with pytest.raises(QkvError, match="is unknown"):
        greedy_decode(tiny_transformer(), src, padding, bos_id=1, eos_id=2, step="")


@CUDA
@pytest.mark.parametrize("engine", ["graph", "compiled-graph", "compiled"])
def test_cuda_engines_give_the_eager_tokens_in_float32(engine: str, monkeypatch) -> None:
    captures: list[int] = []
    original = engine_module.CapturedStep.capture
    monkeypatch.setattr(
        engine_module.CapturedStep, "capture", lambda self, *a: captures.append(1) or original(self, *a)
    )
    model = tiny_gpt(dtype=torch.float32).cuda()
    prompt = torch.randint(50, (2, 4), generator=torch.Generator().manual_seed(0)).cuda()
    for new in (20, 16):  # 4 + 20 - 1 and 4 + 16 - 1 positions: the same cache of 32, so the same graph
        greedy = dict(max_new_tokens=new, temperature=0)
        assert torch.equal(
            generate(model, prompt, step=engine, **greedy), generate(model, prompt, step="static", **greedy)
        )
    assert len(captures) == (1 if engine != "compiled" else 0)
    translator = tiny_transformer().float().cuda()
    src, padding = (t.cuda() for t in sources())
    common = dict(bos_id=1, eos_id=2, max_len_b=20)
    assert greedy_decode(translator, src, padding, step=engine, **common) == greedy_decode(
        translator, src, padding, step="static", **common
    )
    ours = beam_search(translator, src, padding, step=engine, beam_size=3, **common)
    ref = beam_search(translator, src, padding, step="static", beam_size=3, **common)
    assert [h[0].tokens for h in ours] == [h[0].tokens for h in ref]


@CUDA
def test_auto_uses_cuda_graphs_on_cuda() -> None:
    assert resolve_step(tiny_gpt().cuda(), "auto") == "graph"
