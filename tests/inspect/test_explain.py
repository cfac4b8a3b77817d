"""`explain`: the seeds' worked examples digit for digit, and a real model's head equal to its own weights."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect import explain_example, explain_given, explain_model, explain_projected, read_matrices
from qkv.inspect.examples import JOURNEY_INPUTS, QUICK_FOX_K, QUICK_FOX_Q, QUICK_FOX_V, check_tokens
from qkv.layers.capture import capture


def softmax_rows(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_seed_004_reproduces_the_worked_example_computed_independently() -> None:
    e = explain_example("quick-fox")
    assert e.query_tokens == ["The", "quick", "brown", "fox", "jumps"] and e.query == 1  # the seed focuses on "quick"
    # Plain Python for the seed's step 4: "quick"'s query against every key.
    q_quick = [0.5, 0.6]
    dots = [q_quick[0] * k[0] + q_quick[1] * k[1] for k in QUICK_FOX_K]
    assert dots == pytest.approx([0.16, 0.60, 1.04, 1.48, 1.92], abs=1e-12)
    scaled = [d / math.sqrt(2) for d in dots]
    exps = [math.exp(s) for s in scaled]
    weights = [x / sum(exps) for x in exps]
    output = [sum(w * v[c] for w, v in zip(weights, QUICK_FOX_V, strict=True)) for c in range(2)]
    np.testing.assert_allclose(e.scores[1], dots, atol=1e-12)
    np.testing.assert_allclose(e.scaled[1], scaled, atol=1e-12)
    np.testing.assert_allclose(e.weights[1], weights, atol=1e-12)
    np.testing.assert_allclose(e.output[1], output, atol=1e-12)
    # The whole matrices, with numpy.
    Q, K, V = (np.array(m) for m in (QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V))
    expected = softmax_rows(Q @ K.T / math.sqrt(2))
    np.testing.assert_allclose(e.weights, expected, atol=1e-12)
    np.testing.assert_allclose(e.output, expected @ V, atol=1e-12)
    assert [f"{w:.4f}" for w in e.weights[1]] == ["0.0976", "0.1333", "0.1819", "0.2483", "0.3389"]


def test_seed_004_with_the_causal_mask_hides_later_tokens() -> None:
    e = explain_example("quick-fox", causal=True)
    Q, K, V = (np.array(m) for m in (QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V))
    scores = Q @ K.T / math.sqrt(2)
    scores[np.triu_indices(5, k=1)] = -np.inf
    expected = softmax_rows(scores)
    np.testing.assert_allclose(e.weights, expected, atol=1e-12)
    assert np.isneginf(e.masked[1, 2:]).all() and (e.weights[1, 2:] == 0).all()
    assert e.weights[0].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]


def test_seed_003_attention_without_weights_matches_the_book() -> None:
    e = explain_example("journey")
    x = np.array(JOURNEY_INPUTS)
    scores = x @ x[1]  # omega_2j = x^(j) . x^(2)
    np.testing.assert_allclose(e.scores[1], scores, atol=1e-12)
    np.testing.assert_allclose(e.weights[1], softmax_rows(scores), atol=1e-12)
    np.testing.assert_allclose(e.output[1], softmax_rows(scores) @ x, atol=1e-12)
    assert e.scale == 1.0 and e.query == 1  # no scaling in 3.3.1; the seed's query is x^(2), "journey"
    # The numbers the seed's notebook prints.
    assert [f"{s:.4f}" for s in e.scores[1]] == ["0.9544", "1.4950", "1.4754", "0.8434", "0.7070", "1.0865"]
    assert [f"{w:.4f}" for w in e.weights[1]] == ["0.1385", "0.2379", "0.2333", "0.1240", "0.1082", "0.1581"]
    assert [f"{z:.4f}" for z in e.output[1]] == ["0.4419", "0.6515", "0.5683"]


def test_seed_003_trainable_weights_reproduce_section_3_4() -> None:
    e = explain_example("journey-weights")  # W = torch.rand(3, 2) three times after torch.manual_seed(123)
    torch.manual_seed(123)
    W_q, W_k, W_v = (torch.rand(3, 2).double().numpy() for _ in range(3))
    x = np.array(JOURNEY_INPUTS)
    np.testing.assert_allclose(e.projections["W_q"], W_q)
    assert [f"{q:.4f}" for q in e.queries[1]] == ["0.4306", "1.4551"]
    expected = softmax_rows((x @ W_q) @ (x @ W_k).T / math.sqrt(2))
    np.testing.assert_allclose(e.weights, expected, atol=1e-12)
    assert [f"{w:.4f}" for w in e.weights[1]] == ["0.1500", "0.2264", "0.2199", "0.1311", "0.0906", "0.1820"]
    assert [f"{z:.4f}" for z in e.output[1]] == ["0.3061", "0.8210"]


def test_two_heads_are_concatenated_and_projected_by_w_o() -> None:
    x = np.array(JOURNEY_INPUTS)
    rng = np.random.default_rng(0)
    W_q, W_k, W_v = (rng.normal(size=(3, 4)) for _ in range(3))
    W_o = rng.normal(size=(4, 4))
    e = explain_projected(list("abcdef"), x, W_q=W_q, W_k=W_k, W_v=W_v, W_o=W_o, n_heads=2, head=1, causal=True)
    heads = []
    for h in range(2):
        cols = slice(2 * h, 2 * h + 2)
        scores = (x @ W_q[:, cols]) @ (x @ W_k[:, cols]).T / math.sqrt(2)
        scores[np.triu_indices(6, k=1)] = -np.inf
        heads.append(softmax_rows(scores) @ (x @ W_v[:, cols]))
    np.testing.assert_allclose(e.output, heads[1], atol=1e-12)  # the head shown is head 1
    concat = np.concatenate(heads, axis=1)
    np.testing.assert_allclose(e.heads.concat, concat, atol=1e-12)
    np.testing.assert_allclose(e.heads.output, concat @ W_o, atol=1e-12)


@pytest.mark.parametrize("layer,head", [(0, 0), (1, 1)])
def test_a_models_head_equals_its_own_weights_and_its_layer_output(gpt, layer: int, head: int) -> None:
    e = explain_model(gpt, "the lazy fox", layer=layer, head=head, query="z")
    ids = torch.tensor([gpt.tokenizer.encode("the lazy fox")])
    with capture(gpt.model) as acts:
        gpt.model(ids)
    name = f"decoder.blocks.{layer}.self_attn"
    np.testing.assert_allclose(e.weights, acts[f"{name}.weights"][0, head].double().numpy(), atol=1e-6)
    assert e.model_difference < 1e-6 and e.causal and e.query == 6
    assert any(" after LayerNorm times" in n for n in e.notes) and not any("RoPE" in n for n in e.notes)
    np.testing.assert_allclose(e.queries, acts[f"{name}.q"][0, head].double().numpy())
    np.testing.assert_allclose(e.embeddings, acts["embedding.tokens"][0].double().numpy())
    np.testing.assert_allclose(e.positions + e.embeddings, acts["embedding.output"][0].double().numpy(), atol=1e-6)
    # Step 9: the concatenated heads times W_o is what the attention module outputs.
    module = gpt.model.get_submodule(name)
    context = acts[f"{name}.context"]  # (1, h, T, d_k)
    np.testing.assert_allclose(e.heads.concat, module.merge_heads(context)[0].double().numpy(), atol=1e-6)
    np.testing.assert_allclose(
        e.heads.output, module.out_proj(module.merge_heads(context))[0].detach().double().numpy(), atol=1e-6
    )
    data = json.loads(json.dumps(e.to_dict()))
    assert data["masked"][0][1] is None and data["weights"][0][0] == pytest.approx(1.0)  # -inf becomes null


def test_overriding_the_mask_is_noted_and_changes_the_weights(gpt) -> None:
    e = explain_model(gpt, "the fox", causal=False)
    assert e.model_difference > 1e-3 and any("not the model's own" in n for n in e.notes)
    assert (e.weights[0, 1:] > 0).all()


def test_a_translators_cross_attention_has_target_queries_and_source_keys(translator) -> None:
    e = explain_model(translator, "the fox", part="cross", layer=1, head=1, target="over")
    assert e.query_tokens == ["<bos>", "o", "v", "e", "r"] and e.key_tokens == ["t", "h", "e", "␣", "f", "o", "x"]
    assert e.weights.shape == (5, 7) and not e.causal and e.model_difference < 1e-6
    # post-LN: Q reads the block's input itself
    self_attention = explain_model(translator, "the fox", part="decoder", layer=1, target="over")
    assert any("the output of block 0 times" in n for n in self_attention.notes)
    with pytest.raises(QkvError, match="no causal mask"):
        explain_model(translator, "the fox", part="cross", causal=True, target="over")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(layer=2), "--layer 2 is out of range"),
        (dict(head=-1), "--head -1 is out of range"),
        (dict(query="q"), "--query 'q' is not one of the tokens"),
        (dict(query="12"), "--query 12 is out of range"),
        (dict(part="cross"), "--part cross needs a cross-attention, and a GPT language model .decoder only. has none"),
    ],
)
def test_bad_choices_are_one_sentence_errors(gpt, kwargs, message) -> None:
    with pytest.raises(QkvError, match=message):
        explain_model(gpt, "the fox", **kwargs)


def test_matrix_files_in_every_format_give_the_same_explanation(tmp_path) -> None:
    tokens = ["The", "quick", "brown", "fox", "jumps"]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"tokens": tokens, "Q": QUICK_FOX_Q, "K": QUICK_FOX_K, "V": QUICK_FOX_V}))
    per_token = tmp_path / "per_token.json"
    per_token.write_text(json.dumps({t: {"Q": q, "K": k, "V": v} for t, q, k, v in
                                     zip(tokens, QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V, strict=True)}))  # fmt: skip
    table = tmp_path / "qkv.csv"
    rows = [f"{t},{q[0]},{q[1]},{k[0]},{k[1]},{v[0]},{v[1]}" for t, q, k, v in
            zip(tokens, QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V, strict=True)]  # fmt: skip
    table.write_text("token,q1,q2,k1,k2,v1,v2\n" + "\n".join(rows) + "\n")
    reference = explain_example("quick-fox")
    for path in (whole, per_token, table):
        file_tokens, m = read_matrices(path)
        assert check_tokens(file_tokens, None, 5, path) == tokens
        e = explain_given(tokens, m["Q"], m["K"], m["V"], query="quick")
        np.testing.assert_array_equal(e.weights, reference.weights)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("bad.json", '{"Q": [[1, 2], [3]], "K": [[1, 2]], "V": [[1, 2]]}', "different lengths"),
        ("bad.json", '{"Q": [[1, "x"]]}', "not a number"),
        ("bad.json", '{"Queries!": [[1]]}', "not a matrix name"),
        ("bad.json", "{not json", "not valid JSON"),
        ("bad.csv", "token,q1,k1,v1\nThe,0.1,0.2\n", "has 3 cells but the header has 4"),
        ("bad.csv", "token,q1,k1,v1\nThe,0.1,abc,0.3\n", "not a number"),
        ("bad.csv", "token,query,k1\nThe,1,2\n", "not a numbered matrix column"),
        ("bad.txt", "1,2,3", "neither .json nor .csv"),
    ],
)
def test_malformed_matrix_files_are_one_sentence_errors(tmp_path, name, content, message) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(QkvError, match=message):
        read_matrices(path)


def test_shapes_that_do_not_fit_are_errors() -> None:
    with pytest.raises(QkvError, match="one row per token"):
        explain_given(["a", "b"], QUICK_FOX_Q, QUICK_FOX_K, QUICK_FOX_V)
    with pytest.raises(QkvError, match="do not fit together"):
        explain_given(["a", "b"], [[1, 2], [3, 4]], [[1, 2, 3], [4, 5, 6]], [[1], [2]])
    with pytest.raises(QkvError, match="not divisible by 3 heads"):
        explain_projected(["a", "b"], [[1.0, 2.0], [3.0, 4.0]], n_heads=3, d_k=1, W_q=[[1, 2], [3, 4]])


OLD_NAMES = [("004", "quick-fox"), ("003", "journey"), ("003-weights", "journey-weights")]


@pytest.mark.parametrize(("old", "name"), OLD_NAMES)
def test_the_examples_old_numbers_still_name_them(old, name) -> None:
    assert np.array_equal(explain_example(old).weights, explain_example(name).weights)


def test_an_unknown_example_lists_the_names() -> None:
    with pytest.raises(QkvError, match="choose one of quick-fox, journey, journey-weights"):
        explain_example("005")
