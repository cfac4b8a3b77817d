"""SmoothQuant: folding x / s into what writes x and s into the weights leaves the float model as it was, balances
the two ranges at the strength chosen, and lowers the error of int8 activations where one channel is large."""

from __future__ import annotations

import copy

import pytest
import torch

from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Transformer, TransformerConfig
from qkv.models.llama import Llama, LlamaConfig
from qkv.quantization import Int8Linear, quantize_model
from qkv.quantization.smoothing import fold_points, smooth_model

VOCAB = 40


def llama(**changes) -> Llama:
    config = dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=96, context_length=32)
    return Llama(LlamaConfig(**{**config, **changes}))


def gpt() -> GPT:
    return GPT(GPTConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, d_ff=128, context_length=32))


def perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Random weights and norm gains far from 1, one channel of every norm large (as small LMs keep a few)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.05))
            if p.dim() == 1 and "norm" in name and "weight" in name:
                p[5] = 12.0
    return model.eval()


def feed(seed: int = 1):
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(seed))
    return lambda m: m(ids)


def encoder() -> Encoder:
    return Encoder(EncoderConfig(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2, d_ff=128, norm_first=True))


@pytest.mark.parametrize(
    "make", [llama, lambda: llama(n_kv_heads=4, qkv_bias=True), gpt, encoder], ids=["gqa", "mha", "gpt", "encoder"]
)
def test_the_smoothed_model_computes_what_the_float_model_did(make) -> None:
    model = perturbed(make())
    ids = torch.randint(0, VOCAB, (2, 20))
    with torch.no_grad():
        before = model(ids)
        chosen = smooth_model(model, feed(), alphas=(0.5,))  # every input moved, none left as it was
        after = model(ids)
    assert len(chosen) == len(fold_points(model)) and set(chosen.values()) == {0.5}
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


def test_fold_points_follow_the_architecture() -> None:
    """Llama: the norms before attention and the MLP, W_v -> W_o, W_1 -> W_2 (gated); GPT: no W_1 -> W_2 (GELU is
    not linear); a post-LN translator: only W_v -> W_o (its norms write the residual stream)."""
    kinds = lambda model: sorted(type(f.writer).__name__ + ">" + str(len(f.readers)) for f in fold_points(model))  # noqa: E731
    assert kinds(llama(n_layers=1)) == ["Linear>1", "Linear>1", "RMSNorm>2", "RMSNorm>3"]
    assert kinds(gpt())[:3] == ["LayerNorm>1", "LayerNorm>1", "LayerNorm>3"] and len(fold_points(gpt())) == 6
    config = TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, n_heads=2,
                               n_encoder_layers=1, n_decoder_layers=1, norm_first=False)  # fmt: skip
    folds = fold_points(Transformer(config))
    assert len(folds) == 3 and all(f.heads is not None for f in folds)  # encoder self, decoder self and cross


def smoothed_input_range(layer_name: str):
    """A one-layer Llama smoothed at alpha 0.5, its attention, and the largest |x_j| of ``layer_name``'s input
    afterwards, read from the smoothed model on the calibration text."""
    model = perturbed(llama(n_layers=1))  # 4 query heads, 2 key/value heads
    smooth_model(model, feed(), alphas=(0.5,))
    attn = model.decoder.blocks[0].self_attn
    seen = {}
    layer = getattr(attn, layer_name)
    hook = layer.register_forward_pre_hook(lambda _, args: seen.update(x=args[0].abs().flatten(0, -2).amax(0)))
    with torch.no_grad():
        feed()(model)
    hook.remove()
    return attn, seen["x"]


def test_at_one_half_the_ranges_of_x_and_w_meet() -> None:
    """s = sqrt(max|x| / max|W|): after folding, max|x_j / s_j| = max_i |W_ij s_j| = sqrt(max|x_j| max|W_j|), read
    here from the smoothed model itself (its W_q, W_k, W_v and their input)."""
    attn, x = smoothed_input_range("query")
    w = torch.stack([m.weight.detach().abs().amax(0) for m in (attn.query, attn.key, attn.value)]).amax(0)
    torch.testing.assert_close(x, w, rtol=1e-4, atol=1e-6)


def test_query_heads_that_share_a_key_value_head_share_its_factors() -> None:
    """W_o's input, head j read from key/value head j // group: its ranges meet per key/value channel, the
    largest over the group's heads on each side."""
    attn, x = smoothed_input_range("out_proj")
    per_kv = lambda t: t.view(2, 2, -1).amax(1)  # noqa: E731  (h_kv, group, d_k) -> (h_kv, d_k)
    torch.testing.assert_close(per_kv(x), per_kv(attn.out_proj.weight.detach().abs().amax(0)), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("group_size", [32, 0])
def test_smoothing_lowers_the_error_of_int8_activations(group_size) -> None:
    model = perturbed(llama())
    ids = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(7))  # not the calibration's
    with torch.no_grad():
        reference = model(ids)
        plain = quantize_model(copy.deepcopy(model), group_size=group_size, activations="int8")(ids)
        smoothed_model = quantize_model(model, group_size=group_size, activations="int8", smoothing=feed())
        smoothed = smoothed_model(ids)
    error = lambda out: (out - reference).pow(2).mean().item()  # noqa: E731
    assert error(smoothed) < 0.7 * error(plain)


def test_int4_weights_are_left_as_they_are() -> None:
    """int4's 16 levels cannot take the inputs' range: quantize_model does not smooth before them."""
    model = perturbed(llama())
    ids = torch.randint(0, VOCAB, (1, 12))
    with torch.no_grad():
        plain = quantize_model(copy.deepcopy(model), "int4", activations="int8")(ids)
        asked = quantize_model(model, "int4", activations="int8", smoothing=feed())(ids)
    torch.testing.assert_close(asked, plain, rtol=0, atol=0)


def test_the_feed_runs_the_text_in_windows_of_the_context() -> None:
    from types import SimpleNamespace

    from qkv.quantization.smoothing import smoothing_feed
    from qkv.tokenizers import train_tokenizer

    text = "the quick brown fox jumps over the lazy dog " * 3  # 132 characters
    tokenizer = train_tokenizer("char", text)
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_heads=2, n_layers=1, context_length=50))
    bundle = SimpleNamespace(model=model, tokenizer=tokenizer, config=model.config)
    lengths = []
    hook = model.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[-1]))
    with torch.no_grad():
        smoothing_feed(bundle, text)(model)
    hook.remove()
    assert lengths == [50, 50, 32]
    assert smoothing_feed(bundle, "") is None
    config = TransformerConfig(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, d_model=32, n_heads=2)
    translator = Transformer(config)
    assert smoothing_feed(SimpleNamespace(model=translator, tokenizer=tokenizer, config=config), text) is None


def test_quantizing_reports_each_stage_as_it_goes() -> None:
    """``progress(what, done, total)``: smoothing from 0 to every fold point, calibrating, then rounding from 0 to
    every layer, each count rising by one."""
    model = perturbed(llama())
    calls: list[tuple[str, int, int]] = []
    quantize_model(
        model, activations="int8", smoothing=feed(), calibration=feed(2), progress=lambda *a: calls.append(a)
    )
    stages = list(dict.fromkeys(what for what, _, _ in calls))
    assert stages == ["smoothing", "calibrating", "rounding"]
    for stage in ("smoothing", "rounding"):
        counts = [(done, total) for what, done, total in calls if what == stage]
        total = counts[0][1]
        assert [done for done, _ in counts] == list(range(total + 1)) and {t for _, t in counts} == {total}
    assert next(t for w, _, t in calls if w == "smoothing") == len(fold_points(llama()))
    layers = sum(isinstance(m, Int8Linear) for m in model.modules())  # the linear layers and the unembedding
    assert next(t for w, _, t in calls if w == "rounding") == layers > 0
