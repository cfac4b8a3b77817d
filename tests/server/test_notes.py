"""A text with tokens the tokenizer does not know: the answer carries the CLI's <unk> note in X-Qkv-Note."""

from __future__ import annotations

from qkv.tokenizers.unknown import unknown_note


def test_unknown_characters_are_named_in_a_header(gpt) -> None:
    tokenizer = gpt.bundle.tokenizer
    text = "\u2603\u2603\u2603"  # snowmen: never in the training text
    expected = unknown_note(tokenizer, text, "the prompt")
    assert expected is not None and "all 3 tokens" in expected
    for path, body in [
        ("/v1/completions", {"prompt": text, "max_tokens": 2, "temperature": 0}),
        ("/v1/next-token", {"prompt": text}),
    ]:
        response = gpt.client.post(path, json=body)
        assert response.status_code == 200, response.text
        assert response.headers["x-qkv-note"] == expected


def test_known_text_has_no_note_and_notes_do_not_leak_between_requests(gpt) -> None:
    assert "x-qkv-note" in gpt.client.post("/v1/next-token", json={"prompt": "To be \u2603"}).headers
    response = gpt.client.post("/v1/next-token", json={"prompt": "To be"})
    assert response.status_code == 200 and "x-qkv-note" not in response.headers


def test_a_translator_names_the_source_sentence(translator) -> None:
    response = translator.client.post("/v1/translations", json={"text": "one \u2603"})
    assert response.status_code == 200, response.text
    assert "1 of" in response.headers["x-qkv-note"] and "source sentence" in response.headers["x-qkv-note"]
