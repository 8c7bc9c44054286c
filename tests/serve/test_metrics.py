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
    assert info["max_concurrent_requests"] == 512 and info["auto_truncate"] is True
    before = client.get("/metrics").text
    n = sum(v for name, labels, v in samples(before)
            if name == "te_http_requests_total" and labels == {"route": "/embed", "status": "200"})
    for _ in range(3):
        assert client.post("/embed", json={"inputs": "count me"}).status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    page = r.text
    assert metric(page, "te_http_requests_total", route="/embed", status="200") == n + 3
    count = metric(page, "te_request_duration_count", route="/embed")
    assert metric(page, "te_request_duration_bucket", route="/embed", le="+Inf") == count
    assert "# TYPE te_request_duration histogram" in page
    assert metric(page, "te_batch_next_size_count") >= 3 and metric(page, "te_queue_limit") == 512
    # TEI's names: te_request_count / te_request_success / te_request_failure (its error type), te_queue_size
    assert metric(page, "te_request_success_total", route="/embed") >= 3
    assert metric(page, "te_request_count_total", route="/embed") >= metric(page, "te_request_success_total",
                                                                             route="/embed")
    assert client.post("/embed", json={"inputs": []}).status_code == 400
    assert metric(client.get("/metrics").text, "te_request_failure_total", route="/embed", err="empty") >= 1
    assert "te_queue_size" in page and "bertforge_" not in page
    for line in page.splitlines():  # every line a comment or `name{labels} value`
        assert line.startswith("# ") or re.fullmatch(r'[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+', line), line
