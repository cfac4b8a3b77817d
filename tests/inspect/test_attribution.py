"""Direct logit attribution: the parts sum exactly to the model's logit, and match Hugging Face GPT-2's modules."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect.attribution import attribute
from qkv.loading import load
from qkv.model_dir import ModelBundle
from qkv.models import Transformer, TransformerConfig
from tests.inspect.conftest import perturb
from tests.pretrained.conftest import gpt2_dir, gpt2_hf  # noqa: F401  (session fixtures)


def model_logits(bundle: ModelBundle, text: str) -> torch.Tensor:
    with torch.no_grad():
        return bundle.model(torch.tensor([bundle.tokenizer.encode(text)]))[0].double()  # (T, vocab)


def test_the_parts_sum_to_the_models_logit(gpt) -> None:
    text = "the quick brown"
    logits = model_logits(gpt, text)
    result = attribute(gpt, text)
    assert result.target_id == int(logits[-1].argmax()) and result.position == len(text) - 1
    assert result.logit == pytest.approx(float(logits[-1, result.target_id]), abs=1e-5)
    assert result.total() == pytest.approx(result.logit, abs=1e-5)  # exact up to float32 rounding
    np.testing.assert_allclose(result.heads.sum(axis=1) + result.attention_bias, result.attention, atol=1e-6)
    assert set(result.embedding) == {"tokens", "positions"} and result.scale > 0
    some = attribute(gpt, text, target="o", foil="x", position="q")  # a middle position, a logit difference
    q = text.index("q")
    tok = gpt.tokenizer
    expected = logits[q, tok.encode("o")[0]] - logits[q, tok.encode("x")[0]]
    assert some.position == q and some.total() == pytest.approx(float(expected), abs=1e-5)
    data = json.loads(json.dumps(some.to_dict()))
    assert data["foil"]["token"] == "x" and len(data["terms"]) == 2 + 2 * 2 + 1


def test_gpt2_parts_match_transformers_modules(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    """Each block's attention and MLP output, read from Hugging Face's own modules with hooks, through the
    linearised ln_f: the same contributions, and they add up to the logit."""
    bundle = load(str(gpt2_dir))
    text = "The quick brown fox"
    result = attribute(bundle, text, target=" the")
    ids = torch.tensor([bundle.tokenizer.encode(text)])
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for i, block in enumerate(gpt2_hf.transformer.h):
        hooks.append(block.attn.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"attn{i}", out[0])))
        hooks.append(block.mlp.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(f"mlp{i}", out)))
    hooks.append(gpt2_hf.transformer.ln_f.register_forward_pre_hook(lambda m, a: seen.__setitem__("final", a[0])))
    with torch.no_grad():
        logits = gpt2_hf(ids).logits[0, -1].double()
    for hook in hooks:
        hook.remove()
    ln_f = gpt2_hf.transformer.ln_f
    gamma, beta = ln_f.weight.detach().double(), ln_f.bias.detach().double()
    u = gpt2_hf.lm_head.weight[result.target_id].detach().double()
    final = seen["final"][0, -1].double()
    sigma = torch.sqrt(final.var(unbiased=False) + ln_f.eps)

    def contribution(c: torch.Tensor) -> float:
        c = c[0, -1].double()
        return float(((c - c.mean()) * gamma / sigma) @ u)

    assert result.scale == pytest.approx(float(sigma), rel=1e-5)
    np.testing.assert_allclose(result.attention, [contribution(seen[f"attn{i}"]) for i in range(2)], atol=2e-4)
    np.testing.assert_allclose(result.mlp, [contribution(seen[f"mlp{i}"]) for i in range(2)], atol=2e-4)
    assert result.bias == pytest.approx(float(beta @ u), abs=1e-5)
    assert result.total() == pytest.approx(float(logits[result.target_id]), abs=2e-4)
    assert result.heads.shape == (2, 4)


def test_a_pre_ln_translator_attributes_cross_attention_heads_too(char_tokenizer) -> None:
    torch.manual_seed(3)
    config = TransformerConfig(
        src_vocab_size=char_tokenizer.vocab_size, tgt_vocab_size=char_tokenizer.vocab_size, d_model=16, n_heads=2,
        n_encoder_layers=1, n_decoder_layers=2, context_length=24, norm_first=True, final_logits_bias=True,
    )  # fmt: skip
    model = Transformer(config).eval()
    perturb(model)
    bundle = ModelBundle(model, config, char_tokenizer, None, None)
    result = attribute(bundle, "the fox", prefix="ov")
    src = torch.tensor([char_tokenizer.encode("the fox")])
    tgt = torch.tensor([[char_tokenizer.bos_id, *char_tokenizer.encode("ov")]])
    with torch.no_grad():
        logits = model(src, tgt)[0, -1].double()
    assert result.tokens == ["<bos>", "o", "v"] and result.target_id == int(logits.argmax())
    assert result.total() == pytest.approx(float(logits[result.target_id]), abs=1e-5)
    assert result.cross is not None and result.cross_heads.shape == (2, 2)
    np.testing.assert_allclose(result.cross_heads.sum(axis=1) + result.cross_bias, result.cross, atol=1e-6)
    assert [label for label, _ in result.terms()][2:5] == [
        "block 0 attention",
        "block 0 cross-attention",
        "block 0 MLP",
    ]


def test_post_ln_models_bad_targets_and_positions_are_errors(gpt, translator) -> None:
    with pytest.raises(QkvError, match="needs a pre-LN model"):
        attribute(translator, "the fox")
    with pytest.raises(QkvError, match=r"--target 'qu' is 2 tokens \('q', 'u'\), not one"):
        attribute(gpt, "the quick", target="qu")
    with pytest.raises(QkvError, match="--foil is the same token as --target"):
        attribute(gpt, "the quick", target="a", foil="a")
    with pytest.raises(QkvError, match="--position 40 is out of range"):
        attribute(gpt, "the quick", position=40)
    with pytest.raises(QkvError, match="--prefix is for translators"):
        attribute(gpt, "the quick", prefix="x")
