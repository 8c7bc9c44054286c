"""Tests of `bertforge.serve.auth`: with an API key, every route but the health probes and /metrics answers 401
without `Authorization: Bearer KEY` and as usual with it; TEI's client and OpenAI's send the key as they would to
TEI."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import SENTENCES, TIMEOUT, ThreadServer, metric

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")

KEY = "s3cret-key"
POSTS = {"/embed": {"inputs": "good"}, "/embed_all": {"inputs": "good"}, "/similarity": {
    "inputs": {"source_sentence": "good", "sentences": ["bad"]}}, "/tokenize": {"inputs": "good"},
    "/decode": {"ids": [2, 3]}, "/v1/embeddings": {"input": "good"}, "/embeddings": {"input": "good"}}


@pytest.fixture(scope="module")
def keyed_server(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]), api_key=KEY)) as s:
        yield s


def test_every_route_but_health_and_metrics_needs_the_key(keyed_server):
    client = keyed_server.client
    good = {"Authorization": f"Bearer {KEY}"}
    for route, body in POSTS.items():
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
            r = client.post(route, json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (route, headers)
            error = r.json()  # TEI's shapes: its flat OpenAICompatErrorResponse on the OpenAI routes
            assert "Authorization: Bearer" in (error["message"] if "embeddings" in route else error["error"])
        assert client.post(route, json=body, headers=good).status_code == 200, route
    assert client.get("/info").status_code == 401 and client.get("/info", headers=good).status_code == 200
    for probe in ("/health", "/", "/ping", "/docs", "/api-doc/openapi.json"):  # a load balancer's probe and Prometheus need no key, as in TEI
        assert client.get(probe).status_code == 200, probe
    assert client.post("/", json={"inputs": "good"}).status_code == 401  # POST / is the model's route
    page = client.get("/metrics")
    assert page.status_code == 200
    assert metric(page.text, "te_http_requests_total", route="/embed", status="401") == 3


def test_the_clients_send_the_key(keyed_server):
    hub = pytest.importorskip("huggingface_hub")
    vectors = hub.InferenceClient(api_key=KEY, timeout=TIMEOUT).feature_extraction(
        SENTENCES[0], model=keyed_server.url + "/embed")
    assert vectors.shape == (1, 32) and abs(np.linalg.norm(vectors[0]) - 1) < 1e-5
    with pytest.raises(hub.errors.HfHubHTTPError, match="401"):
        hub.InferenceClient(api_key="wrong", timeout=TIMEOUT).feature_extraction(
            SENTENCES[0], model=keyed_server.url + "/embed")
    openai = pytest.importorskip("openai", reason="needs openai: pip install -e '.[test]'")
    client = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)
    assert len(client.embeddings.create(input=["good"], model="embed").data) == 1
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="wrong", timeout=TIMEOUT,
                      max_retries=0).embeddings.create(input=["good"], model="embed")
