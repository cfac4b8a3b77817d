"""POST /v1/translations (qkv.server.routes.translations): the Translator's translation, its usage and metrics."""

from __future__ import annotations

from qkv.decoding.translator import Translator


def test_a_translation_is_the_translators_and_is_counted(translator) -> None:
    texts = ["one two", "three"]
    reply = translator.client.post("/v1/translations", json={"text": texts, "beam": 2}).json()
    expected = Translator.from_bundle(translator.bundle).translate(texts, beam=2)
    assert [t["text"] for t in reply["translations"]] == expected and [t["index"] for t in reply["translations"]] == [
        0,
        1,
    ]
    source = sum(len(translator.bundle.tokenizer.encode(t)) for t in texts)
    assert reply["usage"]["prompt_tokens"] == source
    assert 'qkv_translation_requests_total{status="ok"}' in translator.client.get("/metrics").text


def test_a_language_model_has_no_translations(gpt) -> None:
    refused = gpt.client.post("/v1/translations", json={"text": "one"})
    assert refused.status_code == 404 and "needs a translator" in refused.json()["error"]["message"]
