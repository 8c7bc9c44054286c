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
from bertforge.commands.serve import TEI_ENVIRONMENT
from tests.serve.serve_helpers import LONG, SENTENCES, TIMEOUT, free_port, metric, save_models

TEI_VARIABLES = {variable for variable, _, _ in TEI_ENVIRONMENT.values()}
#: Seconds a server may take to answer /health, and --workers 2 to exit after SIGTERM: three processes load torch
#: (on the shared 2-core machine at a load of 15, startup took 35 to over 60 s, shutdown 6 to over 15 s).
STARTUP, SHUTDOWN = 180, 60

httpx = pytest.importorskip("httpx", reason="needs httpx: pip install -e '.[test]'")
uvicorn = pytest.importorskip("uvicorn", reason="needs uvicorn: pip install -e '.[serve,test]'")


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """The tiny embedding and classification models of the serve tests (`tests/serve/serve_helpers.py`)."""
    return save_models(tmp_path_factory.mktemp("serve_models"))


def _start(args: list[str], port: int, environ: dict[str, str] | None = None) -> subprocess.Popen:
    """`bertforge serve ARGS` on 127.0.0.1:`port` (given as --port, or in `environ` as $PORT), once /health answers."""
    env = {k: v for k, v in os.environ.items() if k not in TEI_VARIABLES}
    env.update(PYTHONUNBUFFERED="1", **(environ or {}))
    where = [] if "PORT" in env else ["--hostname", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", *args, *where, "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + STARTUP
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)  # its workers too: they hold the output pipe open
            raise AssertionError(f"the server did not start: {proc.communicate(timeout=TIMEOUT)[0].decode()}")
        time.sleep(0.1)


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(models):
    import http.client

    port = free_port()
    proc = _start(["--model", str(models["embed"]), "--task", "embed", "--served-model-name", "tiny", "--threads", "1",
                   "--max-batch-tokens", "512", "--max-concurrent-requests", "8", "--max-client-batch-size", "16",
                   "--payload-limit", "100000", "--auto-truncate", "--max-length", "32", "--pooling", "cls",
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
        pipe = bertforge.pipeline("embed", model=models["embed"], pooling="cls", max_length=32, normalize=True)  # /v1: TEI normalises
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
        assert proc.wait(SHUTDOWN) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
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


def test_adapter_options_become_the_servers_adapters_or_one_line(monkeypatch, capsys):
    from bertforge.cli import build_parser, main
    from bertforge.commands import serve as serve_command

    seen = []
    monkeypatch.setattr("bertforge.serve.run_server", lambda config, **kw: seen.append(config) or 0)
    args = build_parser().parse_args(["serve", "--model", "m", "--adapter", "legal=runs/a/model",
                                      "--adapter", "med=runs/b/model"])
    assert serve_command.run(args) == 0
    assert seen[0].adapters == {"legal": "runs/a/model", "med": "runs/b/model"}
    for bad, said in ((["--adapter", "runs/a"], "--adapter takes NAME=DIR, got 'runs/a'"),
                      (["--adapter", "a=x", "--adapter", "a=y"], "--adapter 'a' is given twice")):
        assert main(["serve", "--model", "m", *bad]) == 2
        assert said in capsys.readouterr().err


def test_tei_option_names_and_environment_variables(monkeypatch):
    """TEI's option names are the options (the older names stay as the same options); TEI's environment variables
    are their defaults; a flag on the command line wins; a variable that does not read is one line."""
    from bertforge.cli import build_parser, main
    from bertforge.commands import serve as serve_command

    seen = []
    monkeypatch.setattr("bertforge.serve.run_server", lambda config, **kw: seen.append((config, kw)) or 0)
    for variable in TEI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    parse = build_parser().parse_args
    assert serve_command.run(parse(["serve", "--model-id", "m", "--served-model-name", "n", "--hostname", "0.0.0.0",
                                    "-p", "3000", "--max-concurrent-requests", "7", "--api-key", "k",
                                    "--payload-limit", "999"])) == 0
    config, kw = seen.pop()
    assert (config.model, config.model_name, config.max_queue, config.api_key, config.max_body_bytes) == (
        "m", "n", 7, "k", 999)
    assert (kw["host"], kw["port"]) == ("0.0.0.0", 3000)
    assert serve_command.run(parse(["serve", "--model", "m", "--served-model-name", "n", "--max-concurrent-requests", "7"])) == 0
    config, kw = seen.pop()
    assert (config.model_name, config.max_queue, config.api_key, kw["host"], kw["port"]) == ("n", 7, None,
                                                                                             "127.0.0.1", 8080)
    environment = {"MODEL_ID": "env-model", "SERVED_MODEL_NAME": "env-name", "HOSTNAME": "0.0.0.0", "PORT": "3001",
                   "API_KEY": "env-key", "MAX_CONCURRENT_REQUESTS": "9", "MAX_BATCH_TOKENS": "1024",
                   "MAX_CLIENT_BATCH_SIZE": "4", "PAYLOAD_LIMIT": "5000", "AUTO_TRUNCATE": "true", "POOLING": "cls"}
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    assert serve_command.run(parse(["serve"])) == 0
    config, kw = seen.pop()
    assert (config.model, config.model_name, config.api_key, config.max_queue, config.max_batch_tokens,
            config.max_client_batch_size, config.max_body_bytes, config.auto_truncate, config.pooling) == (
        "env-model", "env-name", "env-key", 9, 1024, 4, 5000, True, "cls")
    assert (kw["host"], kw["port"]) == ("0.0.0.0", 3001)
    assert serve_command.run(parse(["serve", "--model-id", "flag", "--port", "3002", "--max-concurrent-requests", "3"])) == 0
    config, kw = seen.pop()
    assert (config.model, kw["port"], config.max_queue, config.api_key) == ("flag", 3002, 3, "env-key")  # flags win
    monkeypatch.setenv("PORT", "eighty")
    assert main(["serve"]) == 2
    monkeypatch.delenv("PORT")
    monkeypatch.delenv("MODEL_ID")
    assert main(["serve"]) == 2


def test_teis_other_launcher_options_reach_the_server(monkeypatch):
    """TEI's launcher options are accepted, by flag or environment variable, and reach the server's settings; those
    of the process (the socket, the logs, the Hub) reach run_server and the environment huggingface_hub reads."""
    from bertforge.cli import build_parser
    from bertforge.commands import serve as serve_command

    seen = []
    monkeypatch.setattr("bertforge.serve.run_server", lambda config, **kw: seen.append((config, kw)) or 0)
    for variable in TEI_VARIABLES | {"HF_HUB_CACHE"}:
        monkeypatch.delenv(variable, raising=False)
    for variable in ("HF_TOKEN", "HF_HUB_CACHE"):  # run() sets them: recorded here, so they are removed afterwards
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    args = ["serve", "--model-id", "m", "--revision", "v2", "--dtype", "bfloat16", "--tokenization-workers", "3",
            "--max-batch-requests", "16", "--default-prompt-name", "query", "--hf-token", "hf_x",
            "--huggingface-hub-cache", "/tmp/hub", "--uds-path", "/tmp/tei.sock", "--json-output",
            "--disable-spans", "--otlp-service-name", "svc", "--prometheus-port", "9001",
            "--cors-allow-origin", "https://a.example", "--cors-allow-origin", "https://b.example",
            "--pooling", "splade", "--auto-truncate", "false", "--max-response-values", "1000"]
    assert serve_command.run(build_parser().parse_args(args)) == 0
    config, kw = seen.pop()
    assert (config.revision, config.dtype, config.tokenization_workers, config.max_batch_requests,
            config.default_prompt_name, config.disable_spans, config.otlp_service_name, config.cors_allow_origin,
            config.pooling, config.auto_truncate, config.max_response_values) == (
        "v2", "bfloat16", 3, 16, "query", True, "svc", ["https://a.example", "https://b.example"], "splade", False,
        1000)
    assert (kw["uds"], kw["json_output"], kw["prometheus_port"]) == ("/tmp/tei.sock", True, 9001)
    assert (os.environ["HF_TOKEN"], os.environ["HF_HUB_CACHE"]) == ("hf_x", "/tmp/hub")
    monkeypatch.setenv("DEFAULT_PROMPT", "query: ")
    monkeypatch.setenv("CORS_ALLOW_ORIGIN", "*")
    monkeypatch.setenv("AUTO_TRUNCATE", "false")
    assert serve_command.run(build_parser().parse_args(["serve", "--model-id", "m"])) == 0
    config, _ = seen.pop()
    assert (config.default_prompt, config.cors_allow_origin, config.auto_truncate) == ("query: ", ["*"], False)


@pytest.mark.parametrize("args, said", [
    (["--dtype", "float16"], "--dtype float16 needs a GPU"),
    (["--otlp-endpoint", "http://127.0.0.1:4317"], "--otlp-endpoint needs the OpenTelemetry packages"),
    (["--dense-path", "2_Dense"], "--dense-path 2_Dense: no readable config.json"),
    (["--default-prompt-name", "q", "--default-prompt", "q: "], "not both"),
])
def test_what_cannot_work_here_is_refused_at_start_up_in_one_line(models, args, said, capsys, monkeypatch):
    pytest.importorskip("torch")
    if "--otlp-endpoint" in args:
        try:
            import opentelemetry.sdk  # noqa: F401
            pytest.skip("the OpenTelemetry packages are installed here")
        except ImportError:
            pass
    from bertforge.cli import main

    for variable in TEI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert main(["serve", "--model-id", str(models["embed"]), "--port", str(free_port()), *args]) == 2
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err


def test_the_default_bind_is_localhost_whatever_docker_puts_in_hostname(monkeypatch):
    """Docker sets $HOSTNAME to the container's name: that must not make the server listen publicly. An IP address
    in $HOSTNAME (someone's explicit choice, TEI's variable) and --hostname are what it listens on."""
    from bertforge.cli import build_parser
    from bertforge.commands import serve as serve_command

    seen = []
    monkeypatch.setattr("bertforge.serve.run_server", lambda config, **kw: seen.append(kw) or 0)
    for variable in TEI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    for hostname, want in (("3f4e2a1b9c0d", "127.0.0.1"), ("my-container", "127.0.0.1"), ("0.0.0.0", "0.0.0.0"),
                           ("::", "::"), ("", "127.0.0.1")):
        monkeypatch.setenv("HOSTNAME", hostname)
        assert serve_command.run(build_parser().parse_args(["serve", "--model-id", "m"])) == 0
        assert seen.pop()["host"] == want, hostname
    assert serve_command.run(build_parser().parse_args(["serve", "--model-id", "m", "--hostname", "10.0.0.5"])) == 0
    assert seen.pop()["host"] == "10.0.0.5"


def test_a_busy_port_fails_in_one_line_before_the_model_loads(models, capsys, monkeypatch):
    from bertforge.cli import main
    from bertforge.serve import engine

    loaded = []
    monkeypatch.setattr(engine.Engine, "__init__", lambda self, config: loaded.append(config) or None)
    for variable in TEI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model-id", str(models["embed"]), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port} (--port)" in err and len(err.strip().splitlines()) == 1, err
    assert loaded == []  # no model was loaded, nothing said it was ready


def test_bad_environment_and_a_missing_model_are_one_line(monkeypatch, capsys):
    from bertforge.cli import main

    for variable in TEI_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert main(["serve"]) == 2
    assert "give the model: --model-id DIR (or set $MODEL_ID)" in capsys.readouterr().err
    monkeypatch.setenv("MODEL_ID", "m")
    monkeypatch.setenv("MAX_CONCURRENT_REQUESTS", "many")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "$MAX_CONCURRENT_REQUESTS must be int, got 'many'" in err and len(err.strip().splitlines()) == 1


def test_the_environment_configures_a_real_server(models):
    """`bertforge serve` with no options, configured as TEI is, by MODEL_ID, PORT, API_KEY, SERVED_MODEL_NAME and
    MAX_CLIENT_BATCH_SIZE (HOSTNAME: 127.0.0.1)."""
    port = free_port()
    key = {"Authorization": "Bearer k3y"}
    proc = _start([], port, {"MODEL_ID": str(models["embed"]), "PORT": str(port), "HOSTNAME": "127.0.0.1",
                             "API_KEY": "k3y", "SERVED_MODEL_NAME": "from-env", "MAX_CLIENT_BATCH_SIZE": "2"})
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as client:
            assert client.get("/info").status_code == 401
            info = client.get("/info", headers=key).json()
            assert (info["served_model_name"], info["max_client_batch_size"]) == ("from-env", 2)
            r = client.post("/embed", json={"inputs": ["a", "b", "c"]}, headers=key)
            assert r.status_code == 422 and r.json()["error"] == "batch size 3 > maximum allowed batch size 2"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(TIMEOUT)


def _workers(proc: subprocess.Popen) -> list[int]:
    """The worker processes of `bertforge serve --workers N` (multiprocessing's spawned children)."""
    children = []
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        children += [int(pid) for pid in (task / "children").read_text().split()]
    return [pid for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


@pytest.mark.slow  # three processes load torch and the model: ~15 s on 2 cores
def test_metrics_count_the_requests_of_every_worker(models):
    """With --workers 2, each worker serves requests while the other is stopped (SIGSTOP: it cannot accept), and
    /metrics, whichever worker answers it, counts both workers' requests; the metrics directory goes at exit."""
    port = free_port()
    proc = _start(["--model", str(models["embed"]), "--workers", "2", "--max-concurrent-requests", "5"], port)
    try:
        deadline = time.monotonic() + STARTUP
        while len(workers := _workers(proc)) < 2:  # /health answered: at least one is up; wait for the other
            assert time.monotonic() < deadline, "the second worker never started"
            time.sleep(0.2)
        directory = Path(dict(line.split("=", 1) for line in Path(f"/proc/{workers[0]}/environ").read_text()
                              .split("\0") if "=" in line)["PROMETHEUS_MULTIPROC_DIR"])
        assert directory.is_dir()
        url = f"http://127.0.0.1:{port}"
        served = []
        for busy, count in zip(workers, (3, 4)):
            os.kill(busy, signal.SIGSTOP)  # the other worker accepts every connection now
            try:
                served += [httpx.post(f"{url}/embed", json={"inputs": "hello"}, timeout=TIMEOUT, headers={
                    "Connection": "close"}).status_code for _ in range(count)]
            finally:
                os.kill(busy, signal.SIGCONT)
        assert served == [200] * 7
        for _ in range(4):  # fresh connections: either worker may answer; each page counts all 7
            page = httpx.get(f"{url}/metrics", timeout=TIMEOUT, headers={"Connection": "close"}).text
            assert metric(page, "te_http_requests_total", route="/embed", status="200") == 7
            assert metric(page, "te_batch_next_size_count") == 7
            assert metric(page, "te_queue_limit") == 10  # 5 per worker, both alive
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(SHUTDOWN) == 0
        assert not directory.exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(TIMEOUT)


def test_a_unix_socket_a_prometheus_port_and_json_logs(models, tmp_path):
    """--uds-path (the API on a Unix socket, no TCP port), --prometheus-port (/metrics on its own port) and
    --json-output (every log line a JSON object), in a real `bertforge serve`."""
    uds, metrics_port = tmp_path / "tei.sock", free_port()
    env = {k: v for k, v in os.environ.items() if k not in TEI_VARIABLES}
    proc = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model-id", str(models["embed"]),
                             "--uds-path", str(uds), "--prometheus-port", str(metrics_port), "--json-output",
                             "--threads", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    try:
        transport = httpx.HTTPTransport(uds=str(uds))
        deadline = time.monotonic() + STARTUP
        with httpx.Client(transport=transport, base_url="http://tei", timeout=TIMEOUT) as client:
            while True:
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
            assert client.post("/embed", json={"inputs": "good"}).status_code == 200
        page = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=TIMEOUT).text
        assert metric(page, "te_request_success_total", route="/embed") == 1
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=SHUTDOWN)[0].decode()
        assert proc.returncode == 0
        lines = [line for line in output.splitlines() if line.strip()]
        assert lines and all(json.loads(line)["level"] for line in lines), output[:500]
        assert any("ready" in json.loads(line)["message"] for line in lines)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(TIMEOUT)
