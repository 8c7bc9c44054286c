"""The server: the Starlette application (`create_app`), the settings of a serving process, and uvicorn running it
(`run_server`: one process, or `--workers N` with `app_from_environment` as the import-string factory)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from typing import Any

from ..core.constants import SERVE_DEFAULTS
from ..core.errors import BertforgeError
from .config import ENV_CONFIG, ServeConfig
from .engine import Engine
from .errors import ApiError, _error_body
from .handlers import endpoint
from .metrics import MULTIPROC_ENV, MetricsMiddleware
from .responses import json_bytes, json_response

log = logging.getLogger("bertforge")

#: The GIL switch interval of a serving process (Python's default: 5 ms); see `_tune_serving_process`.
SWITCH_INTERVAL = 0.0005
#: Seconds a worker of `--workers N` may leave uvicorn's supervisor's ping unanswered before it is killed and
#: replaced (uvicorn's default, 5 s, killed workers still importing torch on a loaded machine, over and over).
WORKER_HEALTHCHECK = 30


def _require_server_stack() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
        import prometheus_client  # noqa: F401
    except ModuleNotFoundError as err:
        raise BertforgeError(f"serve needs {err.name}: pip install 'bertforge[serve]'") from None


def create_app(config: ServeConfig | None = None, *, engine: Engine | None = None) -> Any:
    """The Starlette application for `config`: the model is loaded here, in the batcher's thread, which then
    waits for requests; the app's shutdown stops it."""
    import contextlib

    _require_server_stack()
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    if engine is None:
        if config is None:
            raise BertforgeError("create_app needs a ServeConfig or an Engine")
        engine = Engine(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        workers = getattr(engine, "tokenization_workers", None)
        if workers:  # --tokenization-workers: the threads that tokenize large requests and write large answers
            import anyio.to_thread

            anyio.to_thread.current_default_thread_limiter().total_tokens = workers
        log.info("serve: %s model %s ready (max %d tokens per batch, queue of %d)", engine.task,
                 engine.model_name, engine.config.max_batch_tokens, engine.config.max_queue)
        try:
            yield
        finally:
            engine.stop()
            engine.metrics.close()

    async def http_error(request: Any, exc: Any) -> Any:
        error = ApiError(exc.status_code, exc.detail or "error", "Validation")
        return json_response(_error_body(request.url.path, error), exc.status_code, exc.headers)

    from . import handlers, tei
    from .openapi import ROUTES, SWAGGER_UI, document

    routes = [Route(r.path, endpoint(getattr(handlers, r.handler, None) or getattr(tei, r.handler)),
                    methods=[r.method]) for r in ROUTES]
    from .. import __version__

    openapi = json_bytes(document(__version__))

    async def openapi_json(request: Any) -> Any:
        from starlette.responses import Response

        return Response(openapi, media_type="application/json")

    async def docs(request: Any) -> Any:
        from starlette.responses import HTMLResponse

        return HTMLResponse(SWAGGER_UI)

    routes += [Route("/api-doc/openapi.json", openapi_json, methods=["GET"]), Route("/docs", docs, methods=["GET"])]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.engine = engine
    api_key = getattr(getattr(engine, "config", None), "api_key", None)
    if api_key:
        from .auth import ApiKeyMiddleware

        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    origins = getattr(getattr(engine, "config", None), "cors_allow_origin", None)
    if origins:  # TEI's --cors-allow-origin: GET and POST, the Content-Type header, these origins ("*": any)
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["content-type"])
    serve_config = getattr(engine, "config", None)
    traces = tracer(serve_config) if serve_config is not None else None
    if traces is not None and not serve_config.disable_spans:  # type: ignore[union-attr]
        app.add_middleware(TracingMiddleware, tracer=traces)
    app.add_middleware(MetricsMiddleware, metrics=engine.metrics)  # outermost: it counts the 401s too
    return app


def _tune_serving_process() -> None:
    """The process-wide settings of a serving process: two of its own, and the environment's switches.

    The GIL: the model thread gives up the GIL in every torch op and needs it back after each; while the event loop
    runs Python (parsing requests, writing answers) it would wait up to the switch interval every time, with the
    torch threads idle. A serving process therefore switches every 0.5 ms instead of 5 ms (at 32 clients on the
    loaded 2-core machine: 117 against 104 requests/s, medians of 6 paired rounds).

    Memory: glibc keeps freed memory for reuse (`system.reuse_freed_memory`, as the embed, predict and evaluate
    commands do), so a forward's large tensors are not fresh pages each time (int8 layers: 1.36x against 1.80x
    float32's speed without and with it, all-MiniLM-L6-v2, 2026-11-25)."""
    from ..core.system import apply_switches, read_switches, reuse_freed_memory

    sys.setswitchinterval(SWITCH_INTERVAL)
    reuse_freed_memory()
    apply_switches(read_switches())  # a worker process starts with the defaults: BERTFORGE_LINEAR & co again


def app_from_environment() -> Any:
    """The app for uvicorn's import-string factory (`--workers N`): options from $BERTFORGE_SERVE_CONFIG."""
    text = os.environ.get(ENV_CONFIG)
    if not text:
        raise BertforgeError(f"${ENV_CONFIG} is not set: start the server with `bertforge serve`")
    _tune_serving_process()
    return create_app(ServeConfig.from_json(text))


class JsonFormatter(logging.Formatter):
    """--json-output: each log line a JSON object (timestamp, level, target, message), as TEI's."""

    def format(self, record: logging.LogRecord) -> str:
        import datetime
        import json

        line = {"timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
                "level": record.levelname, "target": record.name, "message": record.getMessage()}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)


def _log_config(json_output: bool) -> dict[str, Any] | None:
    """uvicorn's logging configuration: its own, or with --json-output every line as JSON (bertforge's too)."""
    if not json_output:
        return None
    import copy

    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["formatters"] = {name: {"()": "bertforge.serve.app.JsonFormatter"} for name in config["formatters"]}
    config["loggers"]["bertforge"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


def tracer(config: ServeConfig) -> Any:
    """--otlp-endpoint: an OpenTelemetry tracer exporting to it (OTLP/gRPC), or None; without the OpenTelemetry
    packages, one line naming the missing one."""
    if not config.otlp_endpoint:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ModuleNotFoundError as err:
        raise BertforgeError(f"serve: --otlp-endpoint needs the OpenTelemetry packages ({err.name} is not "
                             "installed): pip install 'bertforge[otel]'") from None
    provider = TracerProvider(resource=Resource.create({"service.name": config.otlp_service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=config.otlp_endpoint)))
    return provider.get_tracer("bertforge.serve")


class TracingMiddleware:
    """A span per HTTP request (its method, route and status), unless --disable-spans."""

    def __init__(self, app: Any, tracer: Any) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with self.tracer.start_as_current_span(f"{scope['method']} {scope['path']}") as span:
            async def send_status(message: Any) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.status_code", message["status"])
                await send(message)

            span.set_attribute("http.route", scope["path"])
            await self.app(scope, receive, send_status)


def check_port(host: str, port: int, what: str = "--port") -> Any:
    """A socket bound to (host, port), before any model is loaded: a port in use is one line now, not after the
    model loaded and said it was ready."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise BertforgeError(f"serve: cannot listen on {host}:{port} ({what}): {err.strerror or err}") from None
    return sock


def _prometheus(port: int, host: str, registry: Any, sock: Any) -> None:
    """--prometheus-port: /metrics on a port of its own (prometheus_client's server, in a daemon thread)."""
    from prometheus_client import start_http_server

    sock.close()
    start_http_server(port, addr=host, registry=registry)


def run_server(config: ServeConfig, host: str = SERVE_DEFAULTS.host, port: int = SERVE_DEFAULTS.port,
               workers: int = 1, log_level: str = "info", graceful_timeout: float | None = 30.0,
               uds: str | None = None, json_output: bool = False, prometheus_port: int | None = None) -> int:
    """Serve until SIGTERM or SIGINT; in-flight requests finish first. Returns 0 after a clean shutdown.
    The ports (or `uds`) are taken before the model is loaded, so one in use fails at once, in one line."""
    # One process counts in memory, N workers in a directory of our own: not in one the environment names (read
    # when prometheus_client is imported, which the next line does).
    os.environ.pop(MULTIPROC_ENV, None)
    _require_server_stack()
    import uvicorn

    if workers < 1:
        raise BertforgeError(f"serve: workers must be at least 1, got {workers}")
    for name, value in (("port", port), ("prometheus_port", prometheus_port)):
        if value is not None and not 0 <= value <= 65535:
            raise BertforgeError(f"serve: {name} must be in 0..65535, got {value}")
    tracer(config)  # the OpenTelemetry packages, before the model loads
    from .connections import ensure_descriptors, protocol_options

    ensure_descriptors(config.max_connections)
    where: dict[str, Any] = dict(uds=uds) if uds else dict(host=host, port=port)
    options = dict(log_level=log_level, timeout_graceful_shutdown=graceful_timeout, lifespan="on",
                   access_log=False, server_header=False, log_config=_log_config(json_output),
                   **protocol_options(config))
    if options["log_config"] is None:
        options.pop("log_config")  # uvicorn's own
    sock = None if uds else check_port(host, port)
    metrics_sock = check_port(host, prometheus_port, "--prometheus-port") if prometheus_port is not None else None
    _tune_serving_process()
    if workers == 1:
        try:
            app = create_app(config)  # a bad model directory fails here, as one line
        except BaseException:
            for s in (sock, metrics_sock):
                if s is not None:
                    s.close()
            raise
        if metrics_sock is not None:
            _prometheus(prometheus_port, host, app.state.engine.metrics.registry, metrics_sock)  # type: ignore[arg-type]
        server = uvicorn.Server(uvicorn.Config(app, **where, **options))
        # uvicorn re-raises the SIGTERM it caught once it has shut down, which would end the process *by* the
        # signal (status 143); the previous handler then runs instead: before serving it exits, after it is a no-op.
        serving = False

        def on_sigterm(signum: int, frame: Any) -> None:
            if not serving:
                raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_sigterm)
        serving = True
        server.run(sockets=[sock] if sock is not None else None)
        if not server.started:
            raise BertforgeError(f"serve: the server could not start on {uds or f'{host}:{port}'} (see the log above)")
        return 0
    if sock is not None:
        sock.close()  # uvicorn's supervisor binds it itself
    if config.num_threads is None:
        from ..core.system import available_cpus

        # the processes share the machine's cores (a new settings value: the caller's is not changed)
        config = dataclasses.replace(config, num_threads=max(1, available_cpus() // workers))
    Engine(config).stop()  # check the model once here: uvicorn would restart failing workers forever
    os.environ[ENV_CONFIG] = config.to_json()
    # The workers' metrics: each keeps its values in files here, and /metrics sums them (`metrics.Metrics`).
    os.environ[MULTIPROC_ENV] = directory = tempfile.mkdtemp(prefix="bertforge-metrics-")
    if metrics_sock is not None:
        import prometheus_client as prom
        from prometheus_client import multiprocess

        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        _prometheus(prometheus_port, host, registry, metrics_sock)  # type: ignore[arg-type]
    import inspect

    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:  # uvicorn >= 0.30
        options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK
    try:
        uvicorn.run("bertforge.serve:app_from_environment", factory=True, workers=workers, **where, **options)
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)
    return 0
