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
