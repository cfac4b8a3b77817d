"""Activation patching: exact 0s and 1s where the answer is known, and heads checked with hooks on Hugging Face
GPT-2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect.patching import patch
from qkv.inspect.residual import output_stream
from qkv.layers.capture import capture, intervene
from qkv.loading import load
from tests.pretrained.conftest import gpt2_dir, gpt2_hf  # noqa: F401  (session fixtures)

CLEAN, CORRUPT = "the quick brown", "the quack brown"  # one character differs, at position 6


def test_the_residual_map_has_its_known_zeros_and_ones(gpt) -> None:
    calls = []
    result = patch(gpt, CLEAN, CORRUPT, foil="z", progress=lambda done, total: calls.append((done, total)))
    resid = result.map("residual").values  # (rows, positions)
    n = len(CLEAN)
    differs = CLEAN.index("i")
    assert resid.shape == (3, n) and result.map("heads").values.shape == (2, 2)
    expected_embedding = np.zeros(n)
    expected_embedding[differs] = 1.0  # the only input that differs: patching it makes the clean run
    np.testing.assert_allclose(resid[0], expected_embedding, atol=1e-5)
    expected_last = np.zeros(n)
    expected_last[-1] = 1.0  # the last block's output at the last position is what W_U reads
    np.testing.assert_allclose(resid[-1], expected_last, atol=1e-5)
    np.testing.assert_allclose(resid[:, :differs], 0.0, atol=1e-5)  # causal: nothing before it differs
    assert abs(result.clean_difference - result.corrupt_difference) > 0.1
    assert calls[-1] == (3 * n + 2 * 2, 3 * n + 2 * 2)  # every patched run reported
    data = json.loads(json.dumps(result.to_dict()))
    assert [m["name"] for m in data["maps"]] == ["residual", "heads"] and data["target"]["id"] == result.target_id


def naive_residual(bundle, clean: str, corrupt: str, target: int, foil: int) -> np.ndarray:
    """The residual map the plain way: one full forward pass per (row, position), the clean value put in by
    :func:`intervene` (no batching, no skipped blocks). (rows, positions) of m = logit(target) - logit(foil)"""
    model = bundle.model
    ids = [torch.tensor([bundle.tokenizer.encode(t)]) for t in (clean, corrupt)]
    with torch.no_grad(), capture(model) as acts:
        model(ids[0])
    stream = output_stream(model, what="a test")
    found = np.zeros((stream.n_layers + 1, ids[0].shape[1]))
    for row in range(stream.n_layers + 1):
        for p in range(ids[0].shape[1]):

            def edit(t, row=row, p=p):  # noqa: ANN001, ANN202
                t = t.clone()
                t[:, p] = acts[stream.resid(row)][:, p]
                return t

            with torch.no_grad(), intervene(model, {stream.resid(row): edit}):
                logits = model(ids[1])[0, -1].double()
            found[row, p] = float(logits[target] - logits[foil])
    return found


def test_batched_runs_that_skip_early_blocks_equal_plain_patching(gpt, monkeypatch) -> None:
    """However the runs are batched (1 per pass: every pass starts at its own block), the numbers are those of
    full forward passes with one activation replaced."""
    naive = None
    for most in (1, 3, 64):
        monkeypatch.setattr("qkv.inspect.patch_runs.MAX_RUNS", most)
        result = patch(gpt, CLEAN, CORRUPT, foil="z")
        if naive is None:
            naive = naive_residual(gpt, CLEAN, CORRUPT, result.target_id, result.foil_id)
        expected = (naive - result.corrupt_difference) / (result.clean_difference - result.corrupt_difference)
        np.testing.assert_allclose(result.map("residual").values, expected, atol=1e-5, err_msg=f"{most} per pass")


def test_a_llama_with_rope_and_grouped_query_attention_patches_as_plainly(smol_bundle) -> None:
    """The same on a (tiny, random) Llama: rotary positions and one key/value head read from the prefix's cache."""
    clean, corrupt = "The capital of France is", "The capital of Italy is"
    result = patch(smol_bundle, clean, corrupt, target=" Paris", foil=" Rome")
    naive = naive_residual(smol_bundle, clean, corrupt, result.target_id, result.foil_id)
    expected = (naive - result.corrupt_difference) / (result.clean_difference - result.corrupt_difference)
    np.testing.assert_allclose(result.map("residual").values, expected, atol=1e-4)


def test_gpt2_heads_match_hooks_on_transformers(gpt2_dir, gpt2_hf) -> None:  # noqa: F811
    """Patch one head's output z_h (the input of c_proj, its slice of columns) with a forward pre-hook on the
    Hugging Face model: the same recovered fraction."""
    bundle = load(str(gpt2_dir))
    clean, corrupt = "The quick brown fox", "The quick brown man"
    ids = [torch.tensor([bundle.tokenizer.encode(t)]) for t in (clean, corrupt)]
    assert ids[0].shape == ids[1].shape
    result = patch(bundle, clean, corrupt, target=" the", foil=" a")
    t, f = result.target_id, result.foil_id
    z: dict[int, torch.Tensor] = {}
    blocks = gpt2_hf.transformer.h
    hooks = [b.attn.c_proj.register_forward_pre_hook(lambda m, a, i=i: z.__setitem__(i, a[0])) for i, b in
             enumerate(blocks)]  # fmt: skip
    with torch.no_grad():
        clean_logits = gpt2_hf(ids[0]).logits[0, -1]
        clean_z = dict(z)  # each block's z from the clean run
        for hook in hooks:
            hook.remove()
        corrupt_logits = gpt2_hf(ids[1]).logits[0, -1]
    diff = [float(logits[t] - logits[f]) for logits in (clean_logits, corrupt_logits)]
    assert diff[0] == pytest.approx(result.clean_difference, abs=1e-4)
    assert diff[1] == pytest.approx(result.corrupt_difference, abs=1e-4)
    heads = result.map("heads").values
    d_k = 64 // 4
    for layer, head in [(0, 1), (1, 3)]:

        def swap(module, args, layer=layer, head=head):  # noqa: ANN001, ANN202
            patched = args[0].clone()
            patched[..., head * d_k : (head + 1) * d_k] = clean_z[layer][..., head * d_k : (head + 1) * d_k]
            return (patched,)

        hook = blocks[layer].attn.c_proj.register_forward_pre_hook(swap)
        with torch.no_grad():
            logits = gpt2_hf(ids[1]).logits[0, -1]
        hook.remove()
        expected = (float(logits[t] - logits[f]) - diff[1]) / (diff[0] - diff[1])
        assert heads[layer, head] == pytest.approx(expected, abs=1e-3)


def test_a_translator_patches_its_encoder_decoder_and_cross_attention(translator) -> None:
    result = patch(translator, "the fox", "the fix", prefix="ov", foil="z")
    names = [m.name for m in result.maps]
    assert names == ["encoder residual", "encoder heads", "decoder residual", "decoder heads", "cross heads"]
    encoder = result.map("encoder residual").values
    expected = np.zeros(7)
    expected[5] = 1.0  # "o" vs "i": the only source token that differs
    np.testing.assert_allclose(encoder[0], expected, atol=1e-5)
    decoder = result.map("decoder residual").values
    np.testing.assert_allclose(decoder[0], 0.0, atol=1e-5)  # the decoder reads the same prefix in both runs
    np.testing.assert_allclose(decoder[-1], [0.0, 0.0, 1.0], atol=1e-5)
    assert result.prefix_tokens == ["<bos>", "o", "v"] and result.map("cross heads").values.shape == (2, 2)


def test_bad_prompts_and_answers_are_errors(gpt, char_tokenizer) -> None:
    with pytest.raises(QkvError, match="the clean prompt is 9 tokens and the corrupt one 10"):
        patch(gpt, "the quick", "the quick!")
    with pytest.raises(QkvError, match="are the same tokens"):
        patch(gpt, "the quick", "the quick")
    with pytest.raises(QkvError, match="the foil is the target 'w' itself .the corrupt prompt also leads to it"):
        patch(gpt, CLEAN, CORRUPT)  # this random model says "w" after both prompts
    with pytest.raises(QkvError, match="--foil is the same token as the target"):
        patch(gpt, CLEAN, CORRUPT, target="a", foil="a")
    with pytest.raises(QkvError, match="--target 'br' is 2 tokens"):
        patch(gpt, CLEAN, CORRUPT, target="br", foil="z")
