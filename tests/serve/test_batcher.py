"""Tests of `bertforge.serve.batcher`: a full queue refuses at once, waiting requests go through the model as one
batch, and a failing batch is retried one request at a time."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import bertforge
from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import SENTENCES, TIMEOUT, ThreadServer, block_worker, metric

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_overload_is_refused_at_once_and_waiting_requests_are_batched(models):
    config = ServeConfig(model=str(models["embed"]), max_queue=2)
    with ThreadServer(config) as server, ThreadPoolExecutor(4) as pool:
        entered, release = block_worker(server.engine)
        first = pool.submit(server.client.post, "/embed", json={"inputs": SENTENCES[0]})
        assert entered.wait(TIMEOUT)  # the worker holds request 1; the queue is empty
        waiting = [pool.submit(server.client.post, "/embed", json={"inputs": text}) for text in SENTENCES[1:3]]
        deadline = time.monotonic() + TIMEOUT
        while server.engine.batcher.depth() < 2:
            assert time.monotonic() < deadline, "the requests never queued"
            time.sleep(0.01)
        start = time.monotonic()
        r = server.client.post("/embed", json={"inputs": "one too many"})
        assert r.status_code == 429 and "queue is full" in r.json()["error"] and r.headers["retry-after"] == "1"
        assert time.monotonic() - start < 2.0  # refused at once, not queued
        page = server.client.get("/metrics").text
        assert metric(page, "te_queue_size") == 2
        release.set()
        results = [f.result(TIMEOUT) for f in [first, *waiting]]
        assert [r.status_code for r in results] == [200, 200, 200]
        pipe = bertforge.pipeline("embed", model=models["embed"], normalize=True)
        np.testing.assert_allclose(np.array([r.json()[0] for r in results], dtype=np.float32), pipe(SENTENCES[:3]),
                                   rtol=0, atol=1e-5)
        page = server.client.get("/metrics").text
        # the two that waited together went through the model together: one batch of 2 requests
        assert metric(page, "te_batch_next_requests_bucket", le="1.0") == 1
        assert metric(page, "te_batch_next_requests_count") == 2
        assert metric(page, "te_http_requests_total", route="/embed", status="429") == 1
        assert metric(page, "te_queue_size") == 0


def test_a_failing_model_call_is_teis_424_and_spares_the_rest_of_its_batch(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]))) as server, ThreadPoolExecutor(4) as pool:
        entered, release = block_worker(server.engine)
        blocker = pool.submit(server.client.post, "/embed", json={"inputs": "first"})
        assert entered.wait(TIMEOUT)
        real = server.engine.batcher.runners["embed"]

        def fragile(items, features):
            if "boom" in items:
                raise RuntimeError("the model fell over")
            return real(items, features)

        server.engine.batcher.runners["embed"] = fragile
        bad = pool.submit(server.client.post, "/embed", json={"inputs": ["fine", "boom"]})
        good = pool.submit(server.client.post, "/embed", json={"inputs": "good"})
        deadline = time.monotonic() + TIMEOUT
        while server.engine.batcher.depth() < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        release.set()
        assert blocker.result(TIMEOUT).status_code == 200
        r = bad.result(TIMEOUT)
        assert r.status_code == 424 and "the model fell over" in r.json()["error"]  # TEI's Backend error
        assert r.json()["error_type"] == "Backend"
        assert good.result(TIMEOUT).status_code == 200  # it shared a batch with the bad one, and was retried alone
        assert server.client.post("/embed", json={"inputs": "after"}).status_code == 200
        page = server.client.get("/metrics").text
        assert metric(page, "te_batch_failures_total") >= 1
        assert metric(page, "te_http_requests_total", route="/embed", status="424") == 1
