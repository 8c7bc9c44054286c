"""`bertforge serve` (`bertforge.commands.serve`): the server process it starts, with its options; its errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import bertforge
from tests.serve.serve_helpers import LONG, SENTENCES, TIMEOUT, free_port, save_models

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny embedding and classification models of the serve tests (`tests/serve/serve_helpers.py`)."""
    return save_models(tmp_path_factory.mktemp("serve_models"))


def _start(args: list[str], port: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", *args, "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start: {proc.communicate(timeout=TIMEOUT)[0].decode()}")
        time.sleep(0.1)


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(models):
    import http.client

    port = free_port()
    proc = _start(["--model", str(models["embed"]), "--task", "embed", "--model-name", "tiny", "--threads", "1",
                   "--max-batch-tokens", "512", "--max-queue", "8", "--max-client-batch-size", "16",
                   "--max-body-bytes", "100000", "--auto-truncate", "--max-length", "32", "--pooling", "cls",
                   "--graceful-timeout", "10"], port)
    try:
        body = json.dumps({"input": ["the movie was good", LONG], "model": "tiny"}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        conn.putrequest("POST", "/v1/embeddings")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders()
        conn.send(body[:10])  # the request is in flight: its body is still arriving when SIGTERM comes
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert proc.poll() is None, "the server quit with a request in flight"
        conn.send(body[10:])
        response = conn.getresponse()
        data = json.loads(response.read())
        assert response.status == 200, data
        assert data["model"] == "tiny" and len(data["data"]) == 2
        assert data["usage"]["prompt_tokens"] == 6 + 32  # the long one cut to --max-length by --auto-truncate
        pipe = bertforge.pipeline("embed", model=models["embed"], pooling="cls", max_length=32)
        np.testing.assert_allclose(np.array([d["embedding"] for d in data["data"]], dtype=np.float32),
                                   pipe(["the movie was good", LONG]), rtol=0, atol=1e-5)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)


@pytest.mark.slow  # three processes load torch and the model: ~13 s on 2 cores
def test_several_worker_processes(models):
    port = free_port()
    proc = _start(["--model", str(models["classify"]), "--workers", "2", "--head-timeout", "1"], port)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client, ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: client.post("/predict", json={"inputs": SENTENCES[i % 6]}), range(24)))
            assert all(r.status_code == 200 for r in results)
            assert len({json.dumps(r.json()) for r in results}) > 1
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:  # the limits reach the workers
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 408 ")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)


def test_a_missing_model_is_one_line(tmp_path, capsys):
    from bertforge.cli import main

    assert main(["serve", "--model", str(tmp_path / "nope"), "--port", str(free_port())]) == 2
    assert "no such model directory" in capsys.readouterr().err


def test_the_client_cost_options_reach_the_server_config(monkeypatch):
    """serve's guards (--max-input-chars, --head-timeout, --body-timeout, --max-connections) and --device, given on
    the command line, are what the server is configured with; left out, their declared defaults hold."""
    from bertforge.cli import build_parser
    from bertforge.commands import serve as serve_command
    from bertforge.serve.config import ServeConfig

    seen = []
    monkeypatch.setattr("bertforge.serve.run_server", lambda config, **kw: seen.append(config) or 0)
    args = build_parser().parse_args(["serve", "--model", "m", "--max-input-chars", "100", "--head-timeout", "2.5",
                                      "--body-timeout", "7", "--max-connections", "9", "--device", "cpu"])
    assert serve_command.run(args) == 0
    config = seen[0]
    assert (config.max_input_chars, config.head_timeout, config.body_timeout, config.max_connections, config.device) == (
        100, 2.5, 7.0, 9, "cpu")
    assert serve_command.run(build_parser().parse_args(["serve", "--model", "m"])) == 0
    defaults = ServeConfig(model="m")
    assert (seen[1].head_timeout, seen[1].body_timeout, seen[1].max_input_chars) == (
        defaults.head_timeout, defaults.body_timeout, defaults.max_input_chars)
