"""The server on an RNNSearch run: the translator's endpoints, its alignment as the one cross-attention map."""

from __future__ import annotations

import pytest
import torch

from qkv.decoding.translator import Translator
from tests.server.conftest import serve, train_reversal
from tests.server.test_analyses import post


@pytest.fixture(scope="module")
def rnnsearch(tmp_path_factory, one_thread):
    """A tiny RNNSearch for the toy reversal task, 20 steps, with a source and a target vocabulary, served."""
    model = {"d_embedding": 24, "d_hidden": 24, "d_attention": 16, "d_readout": 24}
    run = train_reversal(tmp_path_factory.mktemp("rnnsearch"), arch="rnnsearch", model=model, shared_vocab=False)
    yield from serve(run)


def test_model_info_names_rnnsearch_and_its_endpoints(rnnsearch) -> None:
    info = rnnsearch.client.get("/v1/model").json()
    assert info["kind"] == "rnnsearch" and "RNNSearch" in info["description"]
    assert info["heads"] == 1 and info["encoder_layers"] == info["decoder_layers"] == 1 and info["d_model"] == 24
    assert info["parameters"] == sum(p.numel() for p in rnnsearch.bundle.model.parameters())
    assert "/v1/translations" in info["endpoints"] and "/v1/completions" not in info["endpoints"]


def test_translations_match_the_translator(rnnsearch) -> None:
    reference = Translator.from_bundle(rnnsearch.bundle)
    sentences = ["one two three", "four five"]
    for beam in (1, 3):
        data = post(rnnsearch, "/v1/translations", text=sentences, beam=beam)
        assert [t["text"] for t in data["translations"]] == reference.translate(sentences, beam=beam)


def test_attention_is_the_alignment(rnnsearch) -> None:
    data = post(rnnsearch, "/v1/attention", text="one two", target="TWO ONE")
    (name,) = data["groups"]
    cross = data["groups"]["cross"]
    assert name == "cross" and "additive attention" in cross["description"] and not cross["causal"]
    assert cross["query_tokens"] == data["target_tokens"] and cross["key_tokens"] == data["source_tokens"]
    weights = torch.tensor(cross["weights"])  # (1 layer, 1 head, Tq, Tk)
    assert weights.shape == (1, 1, len("TWO ONE") + 1, len("one two"))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, len("TWO ONE") + 1), atol=1e-3, rtol=0)  # 4 decimals
    assert data["target_tokens"][0] == "<bos>" and not data["generated"]
    greedy = post(rnnsearch, "/v1/attention", text="one two")  # no target: the model's own greedy translation
    assert greedy["target_text"] == Translator.from_bundle(rnnsearch.bundle).translate(["one two"], beam=1)[0]


def test_next_token_follows_the_target_prefix(rnnsearch) -> None:
    data = post(rnnsearch, "/v1/next-token", prompt="one two", target="TW", n=5)
    model, source, target = rnnsearch.bundle.model, rnnsearch.bundle.tokenizer, rnnsearch.bundle.target_tokenizer
    with torch.no_grad():
        memory = model.encode(torch.tensor([source.encode("one two")]))
        logits = model.decode(torch.tensor([[target.bos_id, *target.encode("TW")]]), memory)[0, -1]
    assert data["tokens"][0]["id"] == int(logits.argmax())


def test_tokenize_and_next_token_use_the_target_tokenizer(rnnsearch) -> None:
    response = rnnsearch.client.post("/tokenize", json={"prompt": "TWO", "target": True})
    assert response.status_code == 200, response.text
    target = rnnsearch.bundle.target_tokenizer
    assert target is not None and target.encode("TWO") != rnnsearch.bundle.tokenizer.encode("TWO")
    assert response.json()["tokens"] == target.encode("TWO")
    data = post(rnnsearch, "/v1/next-token", prompt="one two", target="TW", n=3)
    assert [t["token"] for t in data["tokens"]] == [target.id_to_token(t["id"]) for t in data["tokens"]]
