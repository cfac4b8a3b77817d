"""torch.compile: every model's training step (forward, loss, backward) and decode step (a GPT's and an
encoder-decoder's next-token step over the static cache, an encoder's embedding pass) is one graph with no
break; a run compiled with --compile saves plain names and resumes exactly; capture() keeps working on the
plain module.

The training runs compile with the ``aot_eager`` backend: the same Dynamo graph capture and AOTAutograd
forward/backward split as the default inductor backend, without generating C++ kernels (minutes on this
2-core machine). What inductor makes of the graph is torch's business; bench/train_lm.py and
bench/train_gpu.py measure it.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch._dynamo as dynamo
from safetensors.torch import load_file
from torch import Tensor, nn

from qkv.data.pair_batches import TranslationBatch
from qkv.decoding.decode_step import cross_attention_keys
from qkv.decoding.encoder_pass import encoder_hidden
from qkv.decoding.fast_step import CapturedStep, fast_step_for
from qkv.layers.capture import capture
from qkv.models import GPT, Encoder, Transformer, make_config
from qkv.models.encoder import mean_pool
from qkv.models.family import build_model
from qkv.training import TrainConfig, train_language_model
from qkv.training.checkpoint import latest_checkpoint
from qkv.training.metrics import read_metrics
from qkv.training.strategy import use_compile
from qkv.training.tasks.language_model import next_token_loss
from qkv.training.tasks.translation import forward_batch, translation_loss

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

B, T, V = 2, 12, 40
PADDING = torch.tensor([[False] * T, [False] * 7 + [True] * (T - 7)])  # the second sentence is 7 tokens long


def training_step(loss_of, model: nn.Module, *inputs) -> Tensor:
    """What the trainer does for one micro-batch: loss, then backward. Returns the loss, detached."""
    loss = loss_of(model, *inputs)
    loss.backward()
    return loss.detach()


def gpt_loss(model: nn.Module, ids: Tensor, targets: Tensor) -> Tensor:
    return next_token_loss(model(ids), targets)


def encoder_loss(model: nn.Module, ids: Tensor, padding: Tensor) -> Tensor:
    """A sentence-embedding objective: pull the mean-pooled vectors of the two sentences together."""
    pooled = mean_pool(model(ids, padding_mask=padding), padding)  # (B, d)
    return 1 - torch.cosine_similarity(pooled[0], pooled[1], dim=0)


def translation_step_loss(model: nn.Module, batch: TranslationBatch) -> Tensor:
    return translation_loss(forward_batch(model, batch), batch.tgt_out, pad_id=0, label_smoothing=0.1)


def models_and_inputs():
    ids, targets = torch.randint(3, V, (B, T)), torch.randint(3, V, (B, T))
    gpt = GPT(make_config("gpt-nano", vocab_size=V, n_layers=1, dropout=0.1))
    llama = build_model(  # grouped-query attention, Qwen2's q/k/v biases, RMSNorm, SwiGLU
        make_config(
            "llama-micro", vocab_size=V, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, qkv_bias=True, dropout=0.1
        )
    )
    encoder = Encoder(make_config("encoder-mini", vocab_size=V, n_layers=1, dropout=0.1))
    transformer = Transformer(
        make_config(
            "transformer-tiny",
            src_vocab_size=V,
            tgt_vocab_size=V,
            n_encoder_layers=1,
            n_decoder_layers=1,
            d_model=32,
            d_ff=64,
            dropout=0.1,
        )
    )
    batch = TranslationBatch(
        src=ids.masked_fill(PADDING, 0),
        src_padding_mask=PADDING,
        tgt_in=targets[:, :-1],
        tgt_out=targets[:, 1:].masked_fill(PADDING[:, 1:], 0),
        tgt_padding_mask=PADDING[:, 1:],
        n_target_tokens=int((~PADDING[:, 1:]).sum()),
        indices=torch.arange(B),
    )
    return {
        "gpt": (gpt, gpt_loss, (ids, targets)),
        "llama": (llama, gpt_loss, (ids, targets)),
        "encoder": (encoder, encoder_loss, (ids, PADDING)),
        "transformer": (transformer, translation_step_loss, (batch,)),
    }


@pytest.mark.parametrize("name", ["gpt", "llama", "encoder", "transformer"])
def test_the_training_step_of_every_model_is_one_graph(name) -> None:
    model, loss_of, inputs = models_and_inputs()[name]
    model.train()  # dropout on
    dynamo.reset()
    with dynamo.config.patch(trace_autograd_ops=True):  # trace loss.backward() into the graph as well
        explanation = dynamo.explain(functools.partial(training_step, loss_of))(model, *inputs)
    assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
    assert explanation.break_reasons == [] and explanation.graph_count == 1
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)  # the backward ran


def decode_step_and_inputs(name: str, model: nn.Module, ids: Tensor) -> tuple:
    """The function decoding compiles for ``model`` and its arguments, with the cache filled up to position 5."""
    engine = fast_step_for(model)
    if name == "encoder":  # no steps: one pass over the whole (padded) sentences
        return encoder_hidden, (model, engine.projections, ids, PADDING)
    cross = None
    if name == "transformer":
        memory = model.encode(ids, src_padding_mask=PADDING)  # (B, T, d_model)
        cross = cross_attention_keys(model, memory, PADDING, pad_to=16, fixed=True)
    config = model.config
    cache = model.new_cache(16).allocate(B, config.n_kv_heads, config.head_dim, dtype=torch.float32, device="cpu")
    buffers = CapturedStep(cache, ids[:, 5].clone(), torch.full((1,), 5), cross)
    buffers.buffer.normal_()  # keys and values of earlier positions
    return engine.step, (buffers.tokens, buffers.position, buffers.buffer, buffers.cross_args(), 1)


@pytest.mark.parametrize("name", ["gpt", "llama", "encoder", "transformer"])
def test_the_decode_step_of_every_model_is_one_graph(name) -> None:
    model = models_and_inputs()[name][0].eval()
    ids = torch.randint(3, V, (B, T))
    with torch.no_grad():
        step, inputs = decode_step_and_inputs(name, model, ids)
        eager = step(*inputs)
        dynamo.reset()
        explanation = dynamo.explain(step)(*inputs)
        assert explanation.graph_break_count == 0, [b.reason for b in explanation.break_reasons]
        assert explanation.break_reasons == [] and explanation.graph_count == 1
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(*inputs)
    torch.testing.assert_close(compiled, eager, atol=1e-5, rtol=1e-5)
    if name == "encoder":  # the embedding pass gives the model's own vectors
        with torch.no_grad():
            torch.testing.assert_close(eager, model(ids, padding_mask=PADDING), atol=1e-5, rtol=1e-5)


def test_capture_records_on_the_plain_module_of_a_compiled_model() -> None:
    model = GPT(make_config("gpt-nano", vocab_size=V, dropout=0.0)).eval()
    compiled = torch.compile(model, backend="aot_eager")
    ids = torch.randint(0, V, (1, T))
    with torch.no_grad():
        fast = compiled(ids)
        with capture(model) as acts:  # the explicit attention path, in eager mode
            slow = model(ids)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    weights = acts["decoder.blocks.1.self_attn.weights"]  # (B, h, T, T)
    assert weights.shape == (1, 4, T, T)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, T))
    assert torch.equal(acts["logits"], slow)


def test_the_compile_setting() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert not use_compile("auto", cpu) and use_compile("auto", cuda)
    assert use_compile("on", cpu) and not use_compile("off", cuda)


TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40


@pytest.fixture
def aot_eager(monkeypatch):
    """torch.compile with the aot_eager backend (see the module docstring), counting its calls."""
    calls = []
    original = torch.compile

    def compile_(model, **kw):
        calls.append(model)
        return original(model, backend="aot_eager", **kw)

    monkeypatch.setattr(torch, "compile", compile_)
    return calls


def lm_config(tmp_path, name: str, **kw) -> TrainConfig:
    (tmp_path / "text.txt").write_text(TEXT)
    settings = dict(
        data=str(tmp_path / "text.txt"),
        out_dir=str(tmp_path / name),
        preset="gpt-nano",
        model={"context_length": 16, "dropout": 0.1},
        steps=6,
        batch_size=4,
        warmup_steps=1,
        eval_interval=3,
        eval_batches=2,
        log_interval=1,
    )
    return TrainConfig(**{**settings, **kw})


def losses(run_dir) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run_dir) if "train_loss" in r]


def test_a_compiled_run_saves_plain_names_and_resumes_exactly(tmp_path, aot_eager) -> None:
    eager = train_language_model(lm_config(tmp_path, "eager", compile="off"), quiet=True)
    assert aot_eager == []
    whole = train_language_model(lm_config(tmp_path, "whole", compile="on"), quiet=True)
    assert len(aot_eager) == 1 and whole.compile_seconds > 0

    def stop_at_2(trainer, step, loss) -> None:
        if step == 2:
            trainer.request_stop()

    split = lm_config(tmp_path, "split", compile="on")
    assert train_language_model(split, quiet=True, on_step=stop_at_2).step == 2
    assert train_language_model(split, resume=split.out_dir, quiet=True).step == 6

    assert losses(split.out_dir) == losses(whole.run_dir)  # bit for bit, across a resume and a recompile
    torch.testing.assert_close(losses(whole.run_dir), losses(eager.run_dir), atol=0, rtol=1e-5)
    for name in ("model.safetensors", "optimizer.safetensors"):
        compiled = load_file(str(latest_checkpoint(whole.run_dir) / name))
        plain = load_file(str(latest_checkpoint(eager.run_dir) / name))
        assert compiled.keys() == plain.keys()  # no "_orig_mod." anywhere
    best = load_file(str(whole.run_dir / "model.safetensors"))
    assert (
        not [k for k in best if "_orig_mod" in k]
        and best.keys() == load_file(str(eager.run_dir / "model.safetensors")).keys()
    )
