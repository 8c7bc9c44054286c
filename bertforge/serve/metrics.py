"""Prometheus metrics on Prometheus' own client library (`prometheus_client`): counters and histograms of requests
and batches, gauges of the queue, rendered for `GET /metrics`; and the ASGI middleware that counts and times every
HTTP request.

One process keeps them in memory. With `--workers N`, `run_server` points $PROMETHEUS_MULTIPROC_DIR at a private
temporary directory before the workers start; `prometheus_client` then keeps each worker's values in files there,
and `/metrics` sums them over every worker, whichever answers (the gauges over the workers alive). A worker marks
its files dead as it exits; the directory goes with the server."""

from __future__ import annotations

import os
import time
from typing import Any

#: The environment variable that puts `prometheus_client` in multi-process mode (read when it is imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: te_request_failure's "err" label of a status: TEI's error type, lower case
FAILURE = {400: "empty", 413: "validation", 422: "validation", 424: "backend", 429: "overloaded", 503: "unhealthy",
           401: "unauthorized", 404: "not_found", 405: "method", 408: "timeout", 499: "client_closed"}
ROUTES = ("/vertex", "/docs", "/api-doc/openapi.json", "/embed", "/embed_all", "/embed_sparse", "/similarity", "/predict", "/rerank", "/tokenize", "/decode",
          "/v1/embeddings", "/embeddings", "/info", "/health", "/metrics", "/", "/invocations", "/ping")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format, which `generate_latest` writes

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


def multiprocess_mode() -> bool:
    """Whether `prometheus_client` keeps its values in $PROMETHEUS_MULTIPROC_DIR's files (decided when it was
    imported)."""
    from prometheus_client import values

    return values.ValueClass is not values.MutexValue


def _forget_dead_workers() -> None:
    """Drop the gauges of workers that died without saying so (killed: uvicorn's supervisor replaces them), so the
    summed gauges count the workers alive only. Their counters stay: what they served was served."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory or not os.path.isdir(directory):
        return
    from prometheus_client import multiprocess

    for name in os.listdir(directory):
        pid = name.rsplit("_", 1)[-1].removesuffix(".db")
        if name.startswith("gauge_live") and pid.isdigit() and not _alive(int(pid)):
            multiprocess.mark_process_dead(int(pid), directory)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Metrics:
    """The server's metrics. In one process they live in this object's own registry (so several servers in one
    process, as in the tests, count apart); in multi-process mode in the worker's files."""

    def __init__(self) -> None:
        import prometheus_client as prom

        prom.disable_created_metrics()  # no `_created` series: the counters are what they were before
        self.multiprocess = multiprocess_mode()
        if self.multiprocess:
            _forget_dead_workers()
        self.registry = prom.CollectorRegistry()
        common: dict[str, Any] = {"registry": None if self.multiprocess else self.registry}
        live: dict[str, Any] = dict(common, multiprocess_mode="livesum")  # summed over the workers alive
        # TEI's names (router/src/http/server.rs, core/src/queue.rs): te_request_count / _success / _failure,
        # te_request_duration, te_queue_size, te_batch_next_size / _tokens; then bertforge's own, also te_*
        self.count = prom.Counter("te_request_count", "Requests received, by route.", ["route"], **common)
        self.success = prom.Counter("te_request_success", "Requests answered 2xx, by route.", ["route"], **common)
        self.failure = prom.Counter("te_request_failure", "Requests refused or failed, by route and TEI's error "
                                    "type (lower case; else the status).", ["route", "err"], **common)
        self.requests = prom.Counter("te_http_requests", "HTTP requests, by route and status code (499: the "
                                     "client hung up before its body was read).", ["route", "status"], **common)
        self.latency = prom.Histogram("te_request_duration", "Seconds from the request's arrival to its response.",
                                      ["route"], buckets=LATENCY_BUCKETS, **common)
        self.queue_depth = prom.Gauge("te_queue_size", "Requests waiting for the model.", **live)
        self.queue_limit = prom.Gauge("te_queue_limit", "Most requests that may wait (--max-concurrent-"
                                      "requests, per worker); more get 429.", **live)
        self.in_flight = prom.Gauge("te_batch_in_flight", "Requests in the batch the model is computing now.", **live)
        self.inputs = prom.Counter("te_inputs", "Inputs (texts or pairs) the model has computed.", **common)
        self.failures = prom.Counter("te_batch_failures", "Batches whose pipeline call raised.", **common)
        self.batch_requests = prom.Histogram("te_batch_next_requests", "Requests grouped into one pipeline call.",
                                             buckets=SIZE_BUCKETS, **common)
        self.batch_inputs = prom.Histogram("te_batch_next_size", "Inputs in one pipeline call.",
                                           buckets=SIZE_BUCKETS, **common)
        self.batch_tokens = prom.Histogram("te_batch_next_tokens", "Tokens in one pipeline call.",
                                           buckets=TOKEN_BUCKETS, **common)
        self.batch_seconds = prom.Histogram("te_batch_inference_duration", "Compute seconds of one pipeline call.",
                                            buckets=LATENCY_BUCKETS, **common)
        self._series: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}  # (route, status) -> its counter and histogram

    def request(self, route: str, status: int, seconds: float) -> None:
        series = self._series.get((route, status))
        if series is None:  # `labels` looks the series up under a lock: once per (route, status) is enough
            outcome = self.success.labels(route) if 200 <= status < 300 else self.failure.labels(
                route, FAILURE.get(status, str(status)))
            series = self._series[route, status] = (self.requests.labels(route, str(status)),
                                                    self.latency.labels(route), self.count.labels(route), outcome)
        for counter in (series[0], series[2], series[3]):
            counter.inc()
        series[1].observe(seconds)

    def batch(self, requests: int, inputs: int, tokens: int, seconds: float) -> None:
        self.batch_requests.observe(requests)
        self.batch_inputs.observe(inputs)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)
        self.inputs.inc(inputs)

    def batch_failed(self) -> None:
        self.failures.inc()

    def queue(self, depth: int, in_flight: int) -> None:
        """The queue as it is now (set by the batcher as it changes, so other workers' pages see it)."""
        self.queue_depth.set(depth)
        self.in_flight.set(in_flight)

    def render(self) -> bytes:
        """The metrics page: this process's, or in multi-process mode every worker's, summed."""
        import prometheus_client as prom

        if not self.multiprocess:
            return prom.generate_latest(self.registry)
        from prometheus_client import multiprocess

        registry = prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return prom.generate_latest(registry)

    def close(self) -> None:
        """In multi-process mode, mark this worker's gauges dead (it is exiting): the others' pages drop them."""
        if self.multiprocess and os.environ.get(MULTIPROC_ENV):
            from prometheus_client import multiprocess

            multiprocess.mark_process_dead(os.getpid())


class MetricsMiddleware:
    """Counts every HTTP request by route and status and times it (a plain ASGI middleware: no body buffering)."""

    def __init__(self, app: Any, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_status(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            self.metrics.request(route, status, time.perf_counter() - start)
