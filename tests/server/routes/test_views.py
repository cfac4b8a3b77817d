"""POST /v1/walkthrough: the playground's walk-through is qkv.inspect.walkthrough's numbers, and bad input is a 4xx."""

from __future__ import annotations

import numpy as np
import torch

from qkv.inspect.walkthrough import walkthrough
from tests.server.conftest import error_of


def test_the_walkthrough_is_the_inspect_functions_numbers(gpt) -> None:
    response = gpt.client.post("/v1/walkthrough", json={"text": "To be, or not", "top": 3, "decimals": 6})
    assert response.status_code == 200, response.text
    data = response.json()
    walk = walkthrough(gpt.bundle, "To be, or not", top=3)
    config = gpt.bundle.config
    assert data["tokens"] == walk.tokens and data["ids"] == gpt.bundle.tokenizer.encode("To be, or not")
    assert (data["n_layers"], data["n_heads"], data["d_model"]) == (config.n_layers, config.n_heads, config.d_model)
    assert [b["layer"] for b in data["blocks"]] == list(range(config.n_layers))
    for layer, block in enumerate(data["blocks"]):
        np.testing.assert_allclose(block["attention"], walk.attention[layer], atol=1e-6)
        np.testing.assert_allclose(block["norms"], walk.residual_norms[layer + 1], atol=1e-5)
        assert [[t["token"] for t in at] for at in block["lens"]] == walk.lens.top_tokens[layer + 1]
    np.testing.assert_allclose(data["embedding"]["sum"], walk.embedding, atol=1e-6)
    # The model's own last-position logits, and its prediction after the last block.
    ids = torch.tensor([gpt.bundle.tokenizer.encode("To be, or not")])
    with torch.no_grad():
        logits = gpt.bundle.model(ids)[0, -1].double()
    assert data["final"][-1]["id"] == int(logits.argmax()) == data["blocks"][-1]["lens"][-1][0]["id"]
    assert "logits" not in data
    full = gpt.client.post("/v1/walkthrough", json={"text": "To be", "logits": True}).json()
    with torch.no_grad():
        short = gpt.bundle.model(torch.tensor([gpt.bundle.tokenizer.encode("To be")]))[0, -1].double()
    np.testing.assert_allclose(full["logits"], short.numpy(), atol=1e-4)
    assert len(full["vocab"]) == gpt.bundle.tokenizer.vocab_size
    assert "/v1/walkthrough" in gpt.client.get("/v1/model").json()["endpoints"]


def test_bad_walkthrough_requests_get_a_4xx_with_a_message(gpt, translator, encoder) -> None:
    assert "text" in error_of(gpt.client.post("/v1/walkthrough", json={"text": ""}), 422)
    assert "top" in error_of(gpt.client.post("/v1/walkthrough", json={"text": "To be", "top": 0}), 422)
    assert "top" in error_of(gpt.client.post("/v1/walkthrough", json={"text": "To be", "top": 99}), 422)
    message = error_of(gpt.client.post("/v1/walkthrough", json={"text": "to be " * 6}), 400)
    assert "the model's context takes at most 32: shorten it" in message
    message = error_of(gpt.client.post("/v1/walkthrough", json={"text": "x" * 201}), 413)
    assert "--max-prompt-tokens" in message
    for served, title, command in (
        (translator, "an encoder-decoder translator", "qkv translate"),
        (encoder, "an encoder (BERT family)", "qkv embed"),
    ):
        message = error_of(served.client.post("/v1/walkthrough", json={"text": "one two"}), 404)
        assert message == f"the walk-through needs a language model, and this is {title}: use `{command}` with it"


def test_attention_too_large_for_one_answer_is_a_413_naming_the_longest_text(gpt, monkeypatch) -> None:
    """A deep model on a long text would send layers x heads x T^2 weights (SmolLM2: 270 maps, 14 MB of JSON for
    100 tokens); past MAX_WEIGHTS the attention view and the walk-through say how long a text fits."""
    config = gpt.bundle.config
    heads = config.n_layers * config.n_heads
    monkeypatch.setattr("qkv.server.analyses.MAX_WEIGHTS", heads * 10**2)  # 10 tokens (characters) at most
    for endpoint in ("/v1/attention", "/v1/walkthrough"):
        assert gpt.client.post(endpoint, json={"text": "To be, or "}).status_code == 200  # 10 tokens
        message = error_of(gpt.client.post(endpoint, json={"text": "To be, or n"}), 413)
        assert f"over 11 tokens would be {heads * 121:,} attention weights" in message
        assert "shorten the text to 10 tokens" in message
