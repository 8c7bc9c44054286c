"""Prometheus metrics: counters and histograms of requests and batches (one process's view), rendered as text for
`GET /metrics`, and the ASGI middleware that counts and times every HTTP request."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

ROUTES = ("/embed", "/predict", "/rerank", "/v1/embeddings", "/info", "/health", "/metrics")


class Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = list(buckets)
        self.counts = [0] * (len(self.buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, total = [], 0
        sep = "," if labels else ""
        for bound, n in zip([*self.buckets, math.inf], self.counts):
            total += n
            le = "+Inf" if bound == math.inf else _number(bound)
            out.append(f'{name}_bucket{{{labels}{sep}le="{le}"}} {total}')
        braces = f"{{{labels}}}" if labels else ""
        out.append(f"{name}_sum{braces} {_number(self.sum)}")
        out.append(f"{name}_count{braces} {self.count}")
        return out


def _number(value: float) -> str:
    return repr(float(value)) if not float(value).is_integer() else str(int(value))


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TOKEN_BUCKETS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class Metrics:
    """Counters and histograms, rendered in Prometheus' text format (one process's view)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.batch_inputs = Histogram(SIZE_BUCKETS)
        self.batch_requests = Histogram(SIZE_BUCKETS)
        self.batch_tokens = Histogram(TOKEN_BUCKETS)
        self.batch_seconds = Histogram(LATENCY_BUCKETS)
        self.inputs = 0
        self.batch_failures = 0

    def request(self, route: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[route, status] = self.requests.get((route, status), 0) + 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def batch(self, requests: int, inputs: int, tokens: int, seconds: float) -> None:
        with self.lock:
            self.batch_requests.observe(requests)
            self.batch_inputs.observe(inputs)
            self.batch_tokens.observe(tokens)
            self.batch_seconds.observe(seconds)
            self.inputs += inputs

    def render(self, queue_depth: int, queue_limit: int, in_flight: int) -> str:
        with self.lock:
            out = [
                "# HELP bertforge_requests_total HTTP requests, by route and status code (499: the client hung up "
                "before its body was read).",
                "# TYPE bertforge_requests_total counter",
            ]
            for (route, status), n in sorted(self.requests.items()):
                out.append(f'bertforge_requests_total{{route="{route}",status="{status}"}} {n}')
            out += [
                "# HELP bertforge_request_duration_seconds Time from the request's arrival to its response.",
                "# TYPE bertforge_request_duration_seconds histogram",
            ]
            for route, hist in sorted(self.latency.items()):
                out += hist.lines("bertforge_request_duration_seconds", f'route="{route}"')
            out += [
                "# HELP bertforge_queue_depth Requests waiting for the model.",
                "# TYPE bertforge_queue_depth gauge",
                f"bertforge_queue_depth {queue_depth}",
                "# HELP bertforge_queue_limit Most requests that may wait (max_queue); more get 503.",
                "# TYPE bertforge_queue_limit gauge",
                f"bertforge_queue_limit {queue_limit}",
                "# HELP bertforge_batch_in_flight Requests in the batch the model is computing now.",
                "# TYPE bertforge_batch_in_flight gauge",
                f"bertforge_batch_in_flight {in_flight}",
                "# HELP bertforge_inputs_total Inputs (texts or pairs) the model has computed.",
                "# TYPE bertforge_inputs_total counter",
                f"bertforge_inputs_total {self.inputs}",
                "# HELP bertforge_batch_failures_total Batches whose pipeline call raised.",
                "# TYPE bertforge_batch_failures_total counter",
                f"bertforge_batch_failures_total {self.batch_failures}",
            ]
            for name, hist, text in (
                ("bertforge_batch_requests", self.batch_requests, "Requests grouped into one pipeline call."),
                ("bertforge_batch_size", self.batch_inputs, "Inputs in one pipeline call."),
                ("bertforge_batch_tokens", self.batch_tokens, "Tokens in one pipeline call."),
                ("bertforge_batch_duration_seconds", self.batch_seconds, "Compute time of one pipeline call."),
            ):
                out += [f"# HELP {name} {text}", f"# TYPE {name} histogram", *hist.lines(name)]
        return "\n".join(out) + "\n"


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
