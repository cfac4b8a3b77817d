"""ServiceError (qkv.server.errors): every refusal is OpenAI's error shape, with its status and headers."""

from __future__ import annotations

import json

from qkv.server.errors import ServiceError, error_body


def test_the_body_is_openais_shape() -> None:
    assert error_body("no such model", param="model", code="model_not_found") == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def test_a_refusal_becomes_a_json_response_with_its_status_and_headers() -> None:
    error = ServiceError(503, "busy: try again", kind="server_busy", code="server_busy", headers={"Retry-After": "1"})
    response = error.response()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    body = json.loads(response.body)
    assert body["error"] == {"message": "busy: try again", "type": "server_busy", "param": None, "code": "server_busy"}
    assert str(error) == "busy: try again"
