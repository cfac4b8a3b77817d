"""Bodies the JSON parser refuses (nested 100,000 deep, bytes that are not UTF-8) get the 422 and the message
that any invalid JSON gets, as docs/serve.md promises, never a bare 400."""

from __future__ import annotations

import pytest

from tests.server.conftest import error_of

BODIES = [
    ("nested 100,000 deep", b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "not valid JSON"),
    ("invalid UTF-8", b'{"prompt": "caf\xe9"}', "not valid JSON"),
    ("not JSON", b"{prompt", "not valid JSON"),
]


@pytest.mark.parametrize(("name", "body", "words"), BODIES, ids=[b[0] for b in BODIES])
def test_bodies_json_cannot_read_are_422_with_a_message(gpt, name, body, words) -> None:
    response = gpt.client.post("/v1/completions", content=body, headers={"Content-Type": "application/json"})
    message = error_of(response, 422)
    assert words in message and response.json()["error"]["code"] == "invalid_value"
