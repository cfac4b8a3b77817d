"""Every view of qkv.inspect on a family it has no code for (a tiny Llama), and the one refusal line for a view
a family lacks: the views ask the family's description, so neither needs a branch per kind."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from qkv.errors import QkvError
from qkv.inspect import (
    attention_maps,
    attribute,
    detect_heads,
    embedding_matrix,
    explain_model,
    logit_lens,
    next_token,
    patch,
    positional_table,
    trace,
    walkthrough,
    walkthrough_html,
)
from qkv.model_dir import ModelBundle
from qkv.models import GPT, Encoder, EncoderConfig, GPTConfig, LlamaConfig, RNNSearchConfig, Word2VecConfig
from qkv.models.family import family_of, refusal
from qkv.models.llama import Llama
from qkv.models.rnnsearch import RNNSearch
from qkv.models.word2vec import Word2Vec
from tests.inspect.conftest import perturb
from tests.models.test_family_checks import kind_checks

TEXT = "the quick fox"


def bundle_of(model, tokenizer) -> ModelBundle:
    return ModelBundle(model.eval(), model.config, tokenizer, tokenizer if family_of(model).two_vocabularies else None,
                       "tiny")  # fmt: skip


@pytest.fixture(scope="module")
def llama(char_tokenizer) -> ModelBundle:
    torch.manual_seed(3)
    model = Llama(LlamaConfig(vocab_size=char_tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=2,
                              context_length=64))  # fmt: skip
    perturb(model)
    return bundle_of(model, char_tokenizer)


def logits_of(bundle: ModelBundle, text: str) -> torch.Tensor:
    """The model's own logits (T, vocab) on ``text``, without any view in between."""
    with torch.no_grad():
        return bundle.model(torch.tensor([bundle.tokenizer.encode(text)]))[0].double()


def test_trace_and_attention_maps(llama) -> None:
    traced = trace(llama, TEXT)
    assert traced.kind == "llama" and list(traced.parts) == ["decoder"]
    maps = attention_maps(llama, TEXT)
    weights = maps.groups["decoder"].weights  # (L, H, T, T)
    T = len(TEXT)
    assert weights.shape == (2, 4, T, T) and maps.kind == "llama"
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert np.all(np.triu(weights, k=1) == 0)  # causal: no token sees a later one


def test_explain_one_head(llama) -> None:
    e = explain_model(llama, TEXT, layer=1, head=3)
    assert e.model_difference < 1e-5  # the recomputed weights are the model's own
    assert e.embeddings.shape == (len(TEXT), 32) and e.positions is None  # rotary: no position vectors added
    assert any("through RoPE" in n for n in e.notes)
    assert any("block 0 after RMSNorm times" in n for n in e.notes)  # pre-norm, and Llama's norm by its name


def test_next_token_is_the_models_last_distribution(llama) -> None:
    result = next_token(llama, TEXT, temperatures=[1.0, 2.0])
    np.testing.assert_allclose(result.probabilities.sum(-1), 1.0, atol=1e-9)
    model_probs = torch.softmax(logits_of(llama, TEXT)[-1], -1).numpy()
    np.testing.assert_allclose(result.probabilities[0], model_probs, rtol=1e-4, atol=1e-7)


def test_logit_lens_last_row_is_the_models_prediction(llama) -> None:
    lens = logit_lens(llama, TEXT, top=3)
    logits = logits_of(llama, TEXT)
    assert lens.rows == ["embedding", "block 0", "block 1"] and lens.kind == "llama"
    assert lens.final_ids == logits.argmax(-1).tolist()
    assert lens.top_ids[-1][:, 0].tolist() == lens.final_ids and np.all(lens.final_ranks[-1] == 0)
    chosen = torch.softmax(logits, -1)[torch.arange(len(TEXT)), lens.final_ids].numpy()
    np.testing.assert_allclose(lens.final_probs[-1], chosen, rtol=1e-4)
    assert lens.norm.startswith("final ")  # Llama's final norm (LayerNorm today, RMSNorm with its own layers)


def test_attribution_adds_up_to_the_logit(llama) -> None:
    result = attribute(llama, TEXT, foil="z")
    logits = logits_of(llama, TEXT)[-1]
    target = llama.tokenizer.token_to_id(result.target_token)
    assert result.logit == pytest.approx(float(logits[target] - logits[llama.tokenizer.token_to_id("z")]), abs=1e-4)
    assert result.total() == pytest.approx(result.logit, abs=1e-4)
    assert result.heads.shape == (2, 4) and "positions" not in result.embedding  # rotary
    np.testing.assert_allclose(result.heads.sum(-1) + result.attention_bias, result.attention, atol=1e-5)


def test_patching_the_last_stream_recovers_everything(llama) -> None:
    result = patch(llama, "the quick fox", "the slow  fox")
    assert [m.name for m in result.maps] == ["residual", "heads"] and result.kind == "llama"
    resid, heads = result.map("residual").values, result.map("heads").values
    assert resid.shape == (3, len(TEXT)) and heads.shape == (2, 4)
    assert resid[-1, -1] == pytest.approx(1.0, abs=1e-6)  # the final stream at the last position is the answer
    assert resid[-1, :-1] == pytest.approx(0.0, abs=1e-6)  # earlier positions of the last stream change nothing


def test_head_detector(llama) -> None:
    found = detect_heads(llama, length=10, batch=2)
    assert [p.part for p in found.parts] == ["decoder"] and found.kind == "llama"
    for values in found.part().scores.values():
        assert values.shape == (2, 4) and np.all((values >= 0) & (values <= 1))


def test_embeddings_and_positions(llama) -> None:
    matrix, tokenizer = embedding_matrix(llama)
    assert matrix.shape == (tokenizer.vocab_size, 32)
    np.testing.assert_array_equal(matrix, llama.model.embedding.token_embedding.weight.detach().double().numpy())
    table, title = positional_table(llama, length=8)
    assert table.shape == (8, 32) and "'rope'" in title


def test_walkthrough(llama) -> None:
    walk = walkthrough(llama, TEXT, vocab=True)
    assert walk.attention.shape == (2, 4, len(TEXT), len(TEXT)) and walk.position_vectors is None
    np.testing.assert_allclose(walk.logits, logits_of(llama, TEXT)[-1].numpy(), rtol=1e-5, atol=1e-6)
    assert walk.to_dict()["kind"] == "llama" and "<html" in walkthrough_html(walk).lower()


# ------------------------------------------------------------------ views a family lacks: one line each


def tiny(kind: str, vocab: int):
    if kind == "gpt":
        return GPT(GPTConfig(vocab_size=vocab, d_model=8, n_heads=2, n_layers=1, context_length=32))
    if kind == "encoder":
        return Encoder(EncoderConfig(vocab_size=vocab, d_model=8, n_heads=2, n_layers=1, context_length=32))
    if kind == "rnnsearch":
        return RNNSearch(RNNSearchConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_embedding=8, d_hidden=8,
                                         d_attention=8, d_readout=8, context_length=32))  # fmt: skip
    return Word2Vec(Word2VecConfig(vocab_size=vocab, d_model=8))


REFUSED = [  # (family, the view, the capability it lacks, how the view names itself)
    ("encoder", lambda b: logit_lens(b, TEXT), "unembedding", "the logit lens"),
    ("encoder", lambda b: next_token(b, TEXT), "unembedding", "next-token prediction"),
    ("encoder", lambda b: patch(b, "the fox", "the dog"), "unembedding", "activation patching"),
    ("rnnsearch", lambda b: attribute(b, TEXT), "residual stream", "direct logit attribution"),
    ("rnnsearch", lambda b: detect_heads(b), "self-attention heads", "the head detector"),
    ("rnnsearch", lambda b: explain_model(b, TEXT), "self-attention heads", "explaining a head step by step"),
    ("word2vec", lambda b: detect_heads(b), "self-attention heads", "the head detector"),
    ("word2vec", lambda b: attention_maps(b, TEXT), "self-attention heads", "tracing attention"),
    ("word2vec", lambda b: logit_lens(b, TEXT), "residual stream", "the logit lens"),
    ("gpt", lambda b: explain_model(b, TEXT, part="cross"), "cross-attention", "--part cross"),
]


@pytest.mark.parametrize("kind,view,capability,name", REFUSED, ids=[f"{r[0]}-{r[3]}" for r in REFUSED])
def test_a_view_a_family_lacks_is_refused_with_the_familys_one_line(char_tokenizer, kind, view, capability, name):
    bundle = bundle_of(tiny(kind, char_tokenizer.vocab_size), char_tokenizer)
    with pytest.raises(QkvError) as error:
        view(bundle)
    assert str(error.value) == refusal(family_of(kind), capability, name)


def test_rnnsearch_alignment_and_word2vec_vectors_still_work(char_tokenizer) -> None:
    rnn = bundle_of(tiny("rnnsearch", char_tokenizer.vocab_size), char_tokenizer)
    maps = attention_maps(rnn, "the fox", target="le renard")
    assert list(maps.groups) == ["cross"] and maps.groups["cross"].weights.shape == (1, 1, 10, 7)
    np.testing.assert_allclose(maps.groups["cross"].weights.sum(-1), 1.0, atol=1e-6)
    words = bundle_of(tiny("word2vec", char_tokenizer.vocab_size), char_tokenizer)
    matrix, _ = embedding_matrix(words)
    np.testing.assert_array_equal(matrix, words.model.token_embedding.weight.detach().double().numpy())
    table, title = positional_table(words, length=4)
    assert table.shape == (4, 8) and "Word2Vec" in title and "adds no positions" in title


def test_attribution_and_lens_with_an_rms_final_norm(llama) -> None:
    """RMSNorm (Llama's own layers) subtracts no mean: attribution must still add up to the logit."""
    model = copy.deepcopy(llama.model)
    norm = torch.nn.RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(32))
    model.decoder.final_norm = norm
    bundle = ModelBundle(model, model.config, llama.tokenizer, None, "tiny")
    result = attribute(bundle, TEXT)
    logits = logits_of(bundle, TEXT)[-1]
    assert result.logit == pytest.approx(float(logits.max()), abs=1e-4)
    assert result.total() == pytest.approx(result.logit, abs=1e-4)
    assert logit_lens(bundle, TEXT).norm == "final RMSNorm"


def test_inspect_asks_families_and_tests_no_kinds() -> None:
    checks = [check for check in kind_checks() if check.startswith("inspect/")]
    assert checks == [], "kind checks left in qkv.inspect:\n" + "\n".join(checks)


def test_explaining_a_head_of_a_windowed_llama_recomputes_the_models_own_weights(char_tokenizer) -> None:
    torch.manual_seed(4)
    model = Llama(LlamaConfig(vocab_size=char_tokenizer.vocab_size, d_model=32, n_heads=4, n_layers=2,
                              context_length=64, sliding_window=3))  # fmt: skip
    perturb(model)
    e = explain_model(bundle_of(model, char_tokenizer), TEXT, layer=1, head=2)
    assert e.model_difference < 1e-6 and e.causal
    assert (e.weights[-1, :-3] == 0).all() and (e.weights[-1, -3:] > 0).all()  # the last token sees the last 3
    assert any("window of 3 positions" in note for note in e.notes)
