"""Tests of `bertforge.serve.app`: the settings of a serving process, and the factory uvicorn's worker processes
import."""

from __future__ import annotations

import inspect
import re
import sys

import pytest

from bertforge.serve import ServeConfig


def test_a_serving_process_hands_over_the_gil_sooner_and_keeps_freed_memory(monkeypatch, models):
    import bertforge.serve as serve
    import bertforge.serve.app
    import bertforge.core.system

    calls = []
    monkeypatch.setattr(bertforge.core.system, "reuse_freed_memory", lambda choice=None: calls.append(choice) or True)
    monkeypatch.setenv(serve.ENV_CONFIG, ServeConfig(model=str(models["embed"])).to_json())
    monkeypatch.setattr(bertforge.serve.app, "create_app", lambda config: config)  # where app_from_environment finds it
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default (a server run earlier in this process may have changed it)
    try:
        assert serve.app_from_environment().model == str(models["embed"])
        assert sys.getswitchinterval() == serve.SWITCH_INTERVAL < 0.005
    finally:
        sys.setswitchinterval(before)
    assert calls == [None]


def test_the_worker_processes_factory_string_names_app_from_environment():
    """`run_server --workers N` hands uvicorn an import string; each worker process imports the factory by it."""
    importer = pytest.importorskip("uvicorn.importer", reason="needs uvicorn: pip install -e '.[serve,test]'")
    from bertforge.serve import app

    (target,) = re.findall(r'uvicorn\.run\("([^"]+)"', inspect.getsource(app.run_server))
    assert importer.import_from_string(target) is app.app_from_environment


def test_cors_answers_the_origins_it_allows(models):
    """TEI's --cors-allow-origin: a browser's preflight from an allowed origin gets its headers, another none."""
    pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
    from tests.serve.serve_helpers import ThreadServer

    config = ServeConfig(model=str(models["embed"]), cors_allow_origin=["https://app.example"])
    with ThreadServer(config) as s:
        preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
        r = s.client.options("/embed", headers={"Origin": "https://app.example", **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        r = s.client.post("/embed", json={"inputs": "x"}, headers={"Origin": "https://app.example"})
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = s.client.post("/embed", json={"inputs": "x"}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_json_output_lines_and_a_span_per_request(models):
    import json
    import logging

    from bertforge.serve.app import JsonFormatter, TracingMiddleware, _log_config

    record = logging.LogRecord("bertforge", logging.INFO, __file__, 1, "serve: %s ready", ("m",), None)
    line = json.loads(JsonFormatter().format(record))
    assert (line["level"], line["target"], line["message"]) == ("INFO", "bertforge", "serve: m ready")
    config = _log_config(True)
    assert {f["()"] for f in config["formatters"].values()} == {"bertforge.serve.app.JsonFormatter"}
    assert _log_config(False) is None

    spans = []

    class Span:
        def __init__(self, name):
            self.name, self.attributes = name, {}

        def set_attribute(self, key, value):
            self.attributes[key] = value

        def __enter__(self):
            spans.append(self)
            return self

        def __exit__(self, *exc):
            return False

    class Tracer:
        def start_as_current_span(self, name):
            return Span(name)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def noop(message):
        return None

    import asyncio

    asyncio.run(TracingMiddleware(app, Tracer())({"type": "http", "method": "POST", "path": "/embed"}, None, noop))
    assert [(s.name, s.attributes) for s in spans] == [("POST /embed", {"http.route": "/embed",
                                                                          "http.status_code": 200})]
