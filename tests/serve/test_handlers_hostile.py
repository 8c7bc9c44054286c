"""Tests of what `bertforge.serve.handlers` costs and tells a hostile or careless client: a client that hangs up
mid-body is counted as 499, with no 5xx and no traceback; a large chunked body is parsed and tokenized off the
event loop; every refusal of a long input says what the client can do on its route."""

from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import LONG, TIMEOUT, LogRecords, ThreadServer, connect, statuses

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


def test_the_openai_route_never_asks_for_a_field_it_ignores(models):
    """With --auto-truncate false, an input too long is TEI's 422; /v1/embeddings reads no "truncate", so its
    message does not suggest one."""
    with ThreadServer(ServeConfig(model=str(models["embed"]), auto_truncate=False)) as server:
        for body in ({"input": ["good", LONG]}, {"input": "good " * 300}):  # too many tokens; too many characters
            r = server.client.post("/v1/embeddings", json=body)
            message = r.json()["message"]
            assert r.status_code == 422 and message.endswith("; shorten it") and "truncate" not in message, message
        r = server.client.post("/embed", json={"inputs": ["good", LONG]})
        assert r.status_code == 422 and r.json()["error"].endswith('send "truncate": true to cut it')


def test_a_client_hanging_up_mid_body_is_no_5xx_and_no_traceback(guarded_server):
    before = statuses(guarded_server, "/embed")
    with LogRecords() as records:
        for _ in range(3):
            with connect(guarded_server) as sock:
                sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b'Content-Length: 1000\r\n\r\n{"inputs": ["good')
                time.sleep(0.05)  # the app is reading the body
        deadline = time.monotonic() + TIMEOUT
        while statuses(guarded_server, "/embed").get(499, 0) < before.get(499, 0) + 3:
            assert time.monotonic() < deadline, f"hang-ups not counted as 499: {statuses(guarded_server, '/embed')}"
            time.sleep(0.05)
    after = statuses(guarded_server, "/embed")
    assert after.get(500, 0) == before.get(500, 0) and after.get(408, 0) == before.get(408, 0)
    assert [r for r in records.records if r.exc_info or r.levelno >= logging.ERROR] == []


# ------------------------------------------------------------------ the event loop stays free
def test_a_large_chunked_body_is_tokenized_off_the_event_loop(guarded_server):
    """A chunked body declares no size: what decides the thread is the request's characters. The tokenizing is
    made to take two seconds: /health must answer meanwhile."""
    tokenize, busy = guarded_server.engine.tokenize, threading.Event()

    def slow(*args):
        busy.set()
        time.sleep(2.0)
        return tokenize(*args)

    texts = [("the movie was good and " * 14)[:300] for _ in range(256)]  # 76,800 characters
    body = json.dumps({"inputs": texts, "truncate": True}).encode()
    result: dict[str, int] = {}

    def send() -> None:
        chunks = (body[i: i + 8192] for i in range(0, len(body), 8192))  # a generator: sent chunked
        with httpx.Client(base_url=guarded_server.url, timeout=TIMEOUT) as client:
            result["status"] = client.post("/embed", content=chunks,
                                           headers={"Content-Type": "application/json"}).status_code

    guarded_server.engine.tokenize = slow
    try:
        sender = threading.Thread(target=send)
        sender.start()
        assert busy.wait(TIMEOUT)
        latencies = []
        with httpx.Client(base_url=guarded_server.url, timeout=TIMEOUT) as client:
            for _ in range(5):
                start = time.perf_counter()
                assert client.get("/health").status_code == 200
                latencies.append(time.perf_counter() - start)
        sender.join(TIMEOUT)
    finally:
        guarded_server.engine.tokenize = tokenize
    assert result["status"] == 200
    assert max(latencies) < 1.0, latencies  # on the event loop, one of them would wait the 2 s out
