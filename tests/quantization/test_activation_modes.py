"""A model's activation mode sets its layers': "int8" rounds W_2's and W_U's inputs twice, the others' once."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.errors import QkvError
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, Llama, LlamaConfig, Transformer, TransformerConfig
from qkv.quantization import quantization_info, quantize_model, set_activations
from qkv.quantization.activation_modes import model_activations
from qkv.quantization.int8_linear import ACTIVATIONS
from qkv.quantization.model import quantized_layers

SMALL = {"d_model": 32, "n_heads": 4, "d_ff": 64}


def models() -> dict[str, nn.Module]:
    """One model per kind of feed-forward and stack: GPT (W_1, W_2), Llama (gated), a translator (two stacks), an
    encoder (no W_U)."""
    return {
        "gpt": GPT(GPTConfig(vocab_size=40, n_layers=2, context_length=16, **SMALL)),
        "llama": Llama(LlamaConfig(vocab_size=40, n_layers=3, n_kv_heads=2, context_length=16, **SMALL)),
        "translator": Transformer(
            TransformerConfig(src_vocab_size=40, tgt_vocab_size=48, n_encoder_layers=2, n_decoder_layers=1, **SMALL)
        ),
        "encoder": Encoder(EncoderConfig(vocab_size=40, n_layers=2, context_length=16, **SMALL)),
    }


def second_layers(model: nn.Module) -> list[str]:
    """The names of the layers "int8" rounds twice, found independently: W_2 in every block and W_U."""
    blocks = [name for name, module in model.named_modules() if name.endswith("feed_forward")]
    unembedding = [name for name, _ in model.named_modules() if name.split(".")[-1] == "unembedding"]
    return [f"{name}.linear2" for name in blocks] + unembedding


@pytest.mark.parametrize("kind", models())
def test_int8_rounds_w2_and_wu_twice_and_the_rest_once(kind) -> None:
    model = quantize_model(models()[kind], "int8", group_size=32)
    set_activations(model, "int8")
    modes = {name: m.activations for name, m in model.named_modules() if m in quantized_layers(model)}
    twice = second_layers(model)
    blocks = sum(name.endswith("feed_forward") for name, _ in model.named_modules())
    assert len(twice) == blocks + (kind != "encoder") and blocks >= 2
    assert modes == {name: "int8x2" if name in twice else "int8" for name in modes}
    for mode in ("float", "int8x2"):
        set_activations(model, mode)
        assert {m.activations for m in quantized_layers(model)} == {mode}


def test_int4_models_follow_the_same_rule() -> None:
    model = quantize_model(models()["llama"], "int4", activations="int8")
    modes = {name: m.activations for name, m in model.named_modules() if m in quantized_layers(model)}
    assert [name for name, mode in modes.items() if mode == "int8x2"] == second_layers(model)


@pytest.mark.parametrize("mode", ACTIVATIONS)
def test_the_models_mode_is_read_back_from_its_layers(mode) -> None:
    model = set_activations(quantize_model(models()["gpt"], "int8"), mode)
    layers = quantized_layers(model)
    assert model_activations(model, layers, ACTIVATIONS) == mode
    assert quantization_info(model)["activations"] == mode


def test_a_mix_no_mode_makes_is_refused_by_quantization_json() -> None:
    model = set_activations(quantize_model(models()["gpt"], "int8"), "int8")
    for layer in quantized_layers(model):
        layer.activations = "int8"  # every layer once, by hand: no mode of the model does that
    assert model_activations(model, quantized_layers(model), ACTIVATIONS) is None
    with pytest.raises(QkvError, match="no activation mode describes.*set_activations"):
        quantization_info(model)


def test_rounding_w2_and_wu_twice_changes_their_products_only() -> None:
    torch.manual_seed(0)
    model = quantize_model(models()["gpt"], "int8", group_size=32).eval()
    ids = torch.randint(0, 40, (2, 9))
    with torch.no_grad():
        mixed = set_activations(model, "int8")(ids)
        for layer in quantized_layers(model):
            layer.activations = "int8"
        once = model(ids)
        twice = set_activations(model, "int8x2")(ids)
        exact = set_activations(model, "float")(ids)
    assert not torch.equal(mixed, once)
    assert (mixed - exact).norm() < (once - exact).norm() and (twice - exact).norm() < (once - exact).norm()
