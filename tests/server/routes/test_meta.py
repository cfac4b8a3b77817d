"""What the server is (qkv.server.routes.meta): /health, /v1/models (and one model), /v1/model, /metrics and the
playground page."""

from __future__ import annotations


def test_health_models_metrics_and_the_page(gpt) -> None:
    client, name = gpt.client, gpt.bundle.path.name
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == name and health["scheduler"] == "batched"
    listed = client.get("/v1/models").json()
    assert listed["object"] == "list" and [m["id"] for m in listed["data"]] == [name]
    assert client.get(f"/v1/models/{name}").json()["id"] == name
    missing = client.get("/v1/models/gpt-4o")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    info = client.get("/v1/model").json()
    assert info["kind"] == "gpt" and "/v1/completions" in info["endpoints"]
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain") and "qkv_requests_total" in metrics.text
    page = client.get("/")
    assert page.status_code == 200 and "<html" in page.text.lower() and page.headers["cache-control"] == "no-cache"
