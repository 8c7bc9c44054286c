"""Tests of `bertforge.serve.connections`: a head or a body that does not arrive in time is answered 408 and its
connection closed (an idle one silently); trickling does not move a deadline; the app's work is never timed;
connections past the cap get 503 while the others are served. On both of uvicorn's HTTP protocols: httptools' (what
the `serve` extra installs) and h11's (uvicorn's fallback)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import DEADLINE, TIMEOUT, ThreadServer, connect, read_until_closed, statuses

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")
h11_impl = pytest.importorskip("uvicorn.protocols.http.h11_impl", reason="needs h11 (uvicorn's dependency)")

from bertforge.serve.connections import ConnectionGuard, GuardedProtocol  # noqa: E402 (imports uvicorn)


class H11Guarded(ConnectionGuard, h11_impl.H11Protocol):
    """The guard on h11's protocol, uvicorn's fallback without httptools."""


@pytest.fixture(scope="module", params=[GuardedProtocol, H11Guarded], ids=["auto", "h11"])
def guarded_server(request, models):
    """conftest's `guarded_server`, on each protocol."""
    config = ServeConfig(model=str(models["embed"]), head_timeout=DEADLINE, body_timeout=DEADLINE)
    with ThreadServer(config, protocol=request.param) as s:
        yield s


def test_a_half_sent_head_gets_408_and_is_closed(guarded_server):
    with connect(guarded_server) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ") and b"head did not arrive within 0.5 s" in data
    assert DEADLINE * 0.8 < took < DEADLINE + 3


def test_a_trickled_head_does_not_move_its_deadline(guarded_server):
    with connect(guarded_server) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        closed = False
        for _ in range(40):  # a header line every 0.1 s, for up to 4 s
            time.sleep(0.1)
            try:
                sock.sendall(b"X-Slow: 1\r\n")
            except OSError:  # reset: the server closed it
                closed = True
                break
        if not closed:
            read_until_closed(sock)
    assert time.monotonic() - start < DEADLINE + 3


def test_an_idle_connection_is_closed_silently(guarded_server):
    with connect(guarded_server) as sock:
        data, took = read_until_closed(sock)
    assert data == b"" and took < DEADLINE + 3


def test_a_slow_body_gets_408_counted_as_408(guarded_server):
    before = statuses(guarded_server, "/embed")
    with connect(guarded_server) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
                     b'\r\n{"inputs": ')
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ") and b"body did not arrive" in data
    deadline = time.monotonic() + TIMEOUT
    while statuses(guarded_server, "/embed").get(408, 0) == before.get(408, 0):
        assert time.monotonic() < deadline, "the 408 was not counted"
        time.sleep(0.05)
    assert statuses(guarded_server, "/embed").get(500, 0) == before.get(500, 0)


def test_the_apps_work_is_never_timed(guarded_server):
    """The deadlines time the wait for a request's head and body, not its computing (here three deadlines long)."""
    tokenize, entered = guarded_server.engine.tokenize, threading.Event()

    def slow(*args):
        entered.set()
        time.sleep(DEADLINE * 3)
        return tokenize(*args)

    guarded_server.engine.tokenize = slow
    try:
        with httpx.Client(base_url=guarded_server.url, timeout=TIMEOUT) as client:
            assert client.post("/embed", json={"inputs": "good"}).status_code == 200
    finally:
        guarded_server.engine.tokenize = tokenize
    assert entered.is_set()


# ------------------------------------------------------------------ the connection cap
def test_connections_past_the_cap_get_503_and_the_others_are_served(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]), max_connections=3)) as s:
        assert s.client.get("/health").status_code == 200  # the client's kept connection is the first
        held = [connect(s), connect(s)]
        try:
            with connect(s) as extra:
                extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                data, _ = read_until_closed(extra)
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in head
            assert json.loads(body)["error"] == "the server has 3 open connections, its limit; retry later"
            assert s.client.get("/health").status_code == 200
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.2)
        with httpx.Client(base_url=s.url, timeout=TIMEOUT) as other:
            assert other.get("/health").status_code == 200


def test_the_open_files_limit_is_raised_for_the_connection_cap_or_the_option_is_named(monkeypatch):
    import resource

    from bertforge import BertforgeError
    from bertforge.serve.connections import RESERVED_DESCRIPTORS, ensure_descriptors

    limits, set_to = {"soft": 256, "hard": 4096}, []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda which, values: set_to.append(values))
    ensure_descriptors(1000)
    assert set_to == [(1000 + RESERVED_DESCRIPTORS, 4096)]
    limits["soft"] = 2000
    ensure_descriptors(1000)  # enough already: left as it is
    assert len(set_to) == 1
    limits.update(soft=256, hard=512)
    with pytest.raises(BertforgeError, match="--max-connections 1000 needs 1128 open files, and this process may "
                                             "open 512"):
        ensure_descriptors(1000)
