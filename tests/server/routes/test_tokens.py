"""POST /tokenize and /detokenize (qkv.server.routes.tokens): the tokenizer's ids and text, and bad ids refused."""

from __future__ import annotations


def test_tokenize_and_detokenize_round_trip(gpt) -> None:
    client, tokenizer = gpt.client, gpt.bundle.tokenizer
    got = client.post("/tokenize", json={"prompt": "To be", "return_token_strs": True}).json()
    assert got["tokens"] == tokenizer.encode("To be") and got["count"] == len(got["tokens"])
    assert got["token_strs"] == [tokenizer.id_to_token(i) for i in got["tokens"]]
    assert got["max_model_len"] == gpt.bundle.config.context_length
    assert client.post("/detokenize", json={"tokens": got["tokens"]}).json() == {"prompt": "To be"}


def test_bad_ids_and_a_target_on_a_gpt_are_refused(gpt) -> None:
    bad = gpt.client.post("/detokenize", json={"tokens": [1, 10**6]})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_token_id"
    target = gpt.client.post("/tokenize", json={"prompt": "x", "target": True})
    assert target.status_code == 400 and "target is for translators" in target.json()["error"]["message"]
