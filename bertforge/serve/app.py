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


def run_server(config: ServeConfig, host: str = SERVE_DEFAULTS.host, port: int = SERVE_DEFAULTS.port,
               workers: int = 1,
               log_level: str = "info", graceful_timeout: float | None = 30.0) -> int:
    """Serve until SIGTERM or SIGINT; in-flight requests finish first. Returns 0 after a clean shutdown."""
    # One process counts in memory, N workers in a directory of our own: not in one the environment names (read
    # when prometheus_client is imported, which the next line does).
    os.environ.pop(MULTIPROC_ENV, None)
    _require_server_stack()
    import uvicorn

    if workers < 1:
        raise BertforgeError(f"serve: workers must be at least 1, got {workers}")
    if not 0 <= port <= 65535:
        raise BertforgeError(f"serve: port must be in 0..65535, got {port}")
    from .connections import ensure_descriptors, protocol_options

    ensure_descriptors(config.max_connections)
    options = dict(host=host, port=port, log_level=log_level, timeout_graceful_shutdown=graceful_timeout,
                   lifespan="on", access_log=False, server_header=False, **protocol_options(config))
    _tune_serving_process()
    if workers == 1:
        app = create_app(config)  # a bad model directory fails here, as one line
        server = uvicorn.Server(uvicorn.Config(app, **options))
        # uvicorn re-raises the SIGTERM it caught once it has shut down, which would end the process *by* the
        # signal (status 143); the previous handler then runs instead: before serving it exits, after it is a no-op.
        serving = False

        def on_sigterm(signum: int, frame: Any) -> None:
            if not serving:
                raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_sigterm)
        serving = True
        server.run()
        if not server.started:
            raise BertforgeError(f"serve: the server could not start on {host}:{port} (see the log above)")
        return 0
    if config.num_threads is None:
        from ..core.system import available_cpus

        # the processes share the machine's cores (a new settings value: the caller's is not changed)
        config = dataclasses.replace(config, num_threads=max(1, available_cpus() // workers))
    Engine(config).stop()  # check the model once here: uvicorn would restart failing workers forever
    os.environ[ENV_CONFIG] = config.to_json()
    # The workers' metrics: each keeps its values in files here, and /metrics sums them (`metrics.Metrics`).
    os.environ[MULTIPROC_ENV] = directory = tempfile.mkdtemp(prefix="bertforge-metrics-")
    import inspect

    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:  # uvicorn >= 0.30
        options["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK
    try:
        uvicorn.run("bertforge.serve:app_from_environment", factory=True, workers=workers, **options)
    finally:
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(directory, ignore_errors=True)
    return 0
