"""Tests of `bertforge.serve.metrics`: /metrics in Prometheus' text format counts and times every request
(with /health and /info, the other GET routes)."""

from __future__ import annotations

import re

import pytest

from tests.serve.serve_helpers import metric, samples

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_health_info_and_metrics(embed_server):
    client = embed_server.client
    assert client.get("/health").json() == {"status": "ok", "model": "embed", "task": "embed", "queue_depth": 0}
    info = client.get("/info").json()
    assert info["max_input_length"] == 64 and info["hidden_size"] == 32 and info["max_client_batch_size"] == 8
    assert info["max_concurrent_requests"] == info["max_queue"] == 512
    before = client.get("/metrics").text
    n = sum(v for name, labels, v in samples(before)
            if name == "bertforge_requests_total" and labels == {"route": "/embed", "status": "200"})
    for _ in range(3):
        assert client.post("/embed", json={"inputs": "count me"}).status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    page = r.text
    assert metric(page, "bertforge_requests_total", route="/embed", status="200") == n + 3
    count = metric(page, "bertforge_request_duration_seconds_count", route="/embed")
    assert metric(page, "bertforge_request_duration_seconds_bucket", route="/embed", le="+Inf") == count
    assert "# TYPE bertforge_request_duration_seconds histogram" in page
    assert metric(page, "bertforge_batch_size_count") >= 3 and metric(page, "bertforge_queue_limit") == 512
    for line in page.splitlines():  # every line a comment or `name{labels} value`
        assert line.startswith("# ") or re.fullmatch(r'[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+', line), line
