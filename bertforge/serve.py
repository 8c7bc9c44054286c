"""`bertforge serve`: a model behind HTTP, on uvicorn + Starlette.

Endpoints (JSON in, JSON out):

* text-embeddings-inference's API: `POST /embed`, `POST /predict` (classification models), `POST /rerank`
  (cross-encoders: a sequence-classification model scoring (query, text) pairs), `GET /info`;
* OpenAI's embeddings API: `POST /v1/embeddings` (`encoding_format` "float" or "base64", `dimensions`), so the
  `openai` client works unchanged with `base_url="http://HOST:PORT/v1"`;
* `GET /health`, `GET /metrics` (Prometheus text format).

Dynamic batching: a request is validated and tokenized on the event loop, once, into the pipeline's features (their
lengths size the batches), then queued. One worker thread takes the oldest waiting request and every later one of
the same kind that still fits under `max_batch_tokens`, runs their features as one `run_features` call of the
pipeline (which sorts by length and packs without padding; no tokenizing), and hands each request its rows, all of
a batch's answers in one wake-up of the event loop. While one batch computes, the next one gathers: with one client
there is no waiting at all, with many the batches grow by themselves. Vectors are written to JSON with 9 significant
digits, which read back as the same float32 (17-digit float64 text was among the largest costs of a response).

Back-pressure: at most `max_queue` requests wait; one more gets 503 at once (with `Retry-After`). Bodies over
`max_body_bytes`, more than `max_client_batch_size` inputs and (without `truncate`) inputs longer than the model
takes get 413; malformed bodies 400 and wrong fields 422, always with a JSON error. A failing batch is retried one
request at a time, so one bad request cannot fail the others; whatever fails gets a 500 JSON error and the server
goes on serving.

SIGTERM: uvicorn stops accepting, lets in-flight requests finish, the worker drains its queue, exit status 0.
Several processes: `--workers N` runs uvicorn's process supervisor with `app_from_environment` as an import-string
factory; the options travel in the environment variable `BERTFORGE_SERVE_CONFIG` (JSON).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from .errors import BertforgeError

log = logging.getLogger("bertforge")

ENV_CONFIG = "BERTFORGE_SERVE_CONFIG"
TASKS = ("auto", "embed", "classify")
ROUTES = ("/embed", "/predict", "/rerank", "/v1/embeddings", "/info", "/health", "/metrics")
#: Bodies larger than this are tokenized in a thread, so that one huge request does not stall the event loop.
LARGE_BODY = 64 * 1024
#: The GIL switch interval of a serving process (Python's default: 5 ms); see `_tune_serving_process`.
SWITCH_INTERVAL = 0.0005


@dataclass
class ServeConfig:
    """What the server serves and its limits (the command line's options)."""

    model: str
    task: str = "auto"  # "embed", "classify" (predict + rerank), or "auto": from the checkpoint's architecture
    model_name: str | None = None  # reported by /info and /v1/embeddings; default: the directory's name
    max_batch_tokens: int = 4096  # real tokens per forward pass (requests are grouped up to this)
    max_queue: int = 512  # requests waiting for the model; one more gets 503
    max_client_batch_size: int = 256  # inputs in one request; more gets 413
    max_body_bytes: int = 2_000_000  # request body size; more gets 413
    auto_truncate: bool = False  # the default of a request's "truncate" (and the only setting for /v1/embeddings)
    max_length: int | None = None  # the model's limit by default (sentence-transformers' max_seq_length for embed)
    pooling: str | None = None  # embed: "mean" or "cls"; default: what the model directory declares
    num_threads: int | None = None  # PyTorch threads
    quantize: str | None = None  # "int8": int8 dense layers (CPU); None: float32

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise BertforgeError(f"serve: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("max_batch_tokens", "max_queue", "max_client_batch_size", "max_body_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise BertforgeError(f"serve: {name} must be a positive integer, got {value!r}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServeConfig:
        return cls(**json.loads(text))


# ---------------------------------------------------------------------------------------------------- errors
class ApiError(Exception):
    """A request the server answers with `status` and a JSON error naming the problem."""

    def __init__(self, status: int, message: str, kind: str = "Validation") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class Overloaded(ApiError):
    def __init__(self, message: str) -> None:
        super().__init__(503, message, "Overloaded")


# ---------------------------------------------------------------------------------------------------- metrics
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
                "# HELP bertforge_requests_total HTTP requests answered, by route and status code.",
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


# ---------------------------------------------------------------------------------------------------- batching
@dataclass
class Job:
    kind: str
    items: list[Any]
    features: list[Any]  # the pipeline's features of `items` (tokenized once, on arrival; `item` indexes `items`)
    tokens: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


def _settle(outcomes: list[tuple[asyncio.Future, Any, BaseException | None]]) -> None:
    """Complete a batch's futures (on the event loop: one wake-up for the whole batch)."""
    for future, result, error in outcomes:
        if future.done():  # the client went away and the handler was cancelled
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _answer(jobs: Sequence[Job], results: Sequence[Any] | None, error: BaseException | None) -> None:
    """Hand each job its part of `results` (or `error`), from the worker thread to each job's event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future, Any, BaseException | None]]] = {}
    offset = 0
    for job in jobs:
        part = results[offset: offset + len(job.items)] if results is not None else None
        offset += len(job.items)
        by_loop.setdefault(job.loop, []).append((job.future, part, error))
    for loop, outcomes in by_loop.items():
        loop.call_soon_threadsafe(_settle, outcomes)


class Batcher:
    """A bounded queue of requests and the one thread that runs them through the pipelines in token-budget groups.

    `runners[kind](items, features)` computes a list of inputs from their features (a pipeline's `run_features`)
    and returns one result per input (a sequence or an array).
    """

    def __init__(self, runners: dict[str, Callable[[list[Any], list[Any]], Sequence[Any]]], max_batch_tokens: int,
                 max_queue: int, metrics: Metrics | None = None) -> None:
        self.runners = runners
        self.max_batch_tokens = max_batch_tokens
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self.queue: deque[Job] = deque()
        self.cond = threading.Condition()
        self.closing = False
        self.in_flight = 0
        self.thread: threading.Thread | None = None

    # -------------------------------------------------------------- event-loop side
    def start(self, setup: Callable[[], None] | None = None) -> None:
        """Start the worker thread. `setup` runs in it before its first batch, and what it raises is raised here
        (the thread then ends): `Engine` loads and warms its model there."""
        ready, failed = threading.Event(), []

        def work() -> None:
            try:
                if setup is not None:
                    setup()
            except BaseException as err:
                failed.append(err)
                return
            finally:
                ready.set()
            self._run()

        self.thread = threading.Thread(target=work, name="bertforge-serve-batcher", daemon=True)
        self.thread.start()
        ready.wait()
        if failed:
            self.thread.join()
            raise failed[0]

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def depth(self) -> int:
        return len(self.queue)

    def submit(self, kind: str, items: list[Any], features: list[Any], tokens: int) -> asyncio.Future:
        """Queue a request (its inputs, their features and their token count); its future gets the list of results.
        Raises Overloaded when the queue is full."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self.cond:
            if self.closing or not self.alive:
                raise Overloaded("the server is shutting down")
            if len(self.queue) >= self.max_queue:
                raise Overloaded(f"the queue is full ({self.max_queue} requests waiting); retry later")
            self.queue.append(Job(kind, items, features, tokens, loop, future))
            self.cond.notify()
        return future

    def close(self, timeout: float | None = None) -> None:
        """Finish what is queued, then stop the thread."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout)

    # -------------------------------------------------------------- worker side
    def _take(self) -> list[Job] | None:
        """The oldest job and the later ones of its kind that fit the token budget (in arrival order)."""
        with self.cond:
            while not self.queue and not self.closing:
                self.cond.wait()
            if not self.queue:
                return None
            first = self.queue.popleft()
            jobs, tokens, skipped = [first], first.tokens, []
            while self.queue:
                job = self.queue[0]
                if job.kind != first.kind:
                    skipped.append(self.queue.popleft())
                    continue
                if tokens + job.tokens > self.max_batch_tokens:
                    break
                jobs.append(self.queue.popleft())
                tokens += job.tokens
            self.queue.extendleft(reversed(skipped))  # other kinds keep their places at the front
            self.in_flight = len(jobs)
            return jobs

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                self._execute(jobs)
            except BaseException as err:  # never leave a client waiting, whatever happened
                log.exception("serve: batch failed")
                _answer(jobs, None, err)
            finally:
                self.in_flight = 0

    def _execute(self, jobs: list[Job]) -> None:
        items: list[Any] = []
        features: list[Any] = []
        for job in jobs:  # one list of inputs: each job's features point past the inputs of the jobs before it
            offset = len(items)
            items += job.items
            features += job.features if not offset else [replace(f, item=f.item + offset) for f in job.features]
        start = time.perf_counter()
        try:
            results = self.runners[jobs[0].kind](items, features)
            if len(results) != len(items):
                raise RuntimeError(f"the pipeline gave {len(results)} results for {len(items)} inputs")
        except Exception as err:
            with self.metrics.lock:
                self.metrics.batch_failures += 1
            if len(jobs) > 1:  # find the culprit: one request at a time
                for job in jobs:
                    self._execute([job])
                return
            log.error("serve: %s request of %d input(s) failed: %s: %s", jobs[0].kind, len(items),
                      type(err).__name__, err)
            _answer(jobs, None, err)
            return
        self.metrics.batch(len(jobs), len(items), sum(job.tokens for job in jobs), time.perf_counter() - start)
        _answer(jobs, results, None)


# ---------------------------------------------------------------------------------------------------- the model
def detect_task(model_dir: Path) -> str:
    """"classify" for a sequence-classification checkpoint, else "embed"."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "embed"  # the pipeline will name the problem
    architectures = config.get("architectures") if isinstance(config, dict) else None
    if isinstance(architectures, list) and any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return "classify"
    return "embed"


class Engine:
    """The pipelines of one model, the batcher in front of them, and what the endpoints need to know.

    `pipelines[kind]` is the pipeline a request kind runs: "embed" for an embedding model; "classify" and
    "classify_raw" (scores, logits) and "rerank" and "rerank_raw" (a cross-encoder's ranking) for a
    sequence-classification model, all on one copy of the weights. A request is tokenized once, on arrival, into the
    pipeline's features (their lengths size the batches); the worker only packs and computes them.

    All of the model's torch work (loading, int8 calibration, the warm-up, every batch) runs in the batcher's one
    thread, from construction on. Had another thread run a parallel torch op first (loading does), OpenMP would
    keep a second team of threads for it; with more OpenMP threads than CPUs, GNU OpenMP's idle workers stop
    spinning and sleep, and every op of a small batch then waits for a wake-up. Measured (all-MiniLM-L6-v2, one
    sentence, 2 threads on 2 cores, 2026-11-27): 14 ms a call in a worker thread after loading in the main one,
    7 ms with everything in one thread.
    """

    def __init__(self, config: ServeConfig) -> None:
        model_dir = Path(config.model)
        if not model_dir.is_dir():
            raise BertforgeError(f"{model_dir}: no such model directory")
        self.config = config
        self.model_name = config.model_name or model_dir.resolve().name
        self.task = detect_task(model_dir) if config.task == "auto" else config.task
        self.metrics = Metrics()
        self.batcher = Batcher({}, config.max_batch_tokens, config.max_queue, self.metrics)
        self.batcher.start(setup=lambda: self._load(model_dir))  # raises what loading raised

    def _load(self, model_dir: Path) -> None:
        """Load the pipelines and warm them up, in the batcher's thread (see the class docstring)."""
        from .pipelines import pipeline
        from .pipelines.embed import sentence_transformers_settings

        config = self.config
        common = dict(max_length=config.max_length, batch_tokens=config.max_batch_tokens,
                      batch_size=config.max_batch_tokens, progress=False, num_threads=config.num_threads)
        pipelines: dict[str, Any] = {}
        if self.task == "embed":
            # Unnormalised rows: each request says whether it wants them normalised.
            embed = pipeline("embed", model=model_dir, pooling=config.pooling, normalize=False,
                             quantize=config.quantize, **common)
            self.default_normalize = bool(sentence_transformers_settings(model_dir).get("normalize", False))
            self.hidden_size = embed.hidden_size
            pipelines["embed"] = main = embed
        else:
            if config.pooling is not None:
                raise BertforgeError("serve: --pooling is for embedding models, not classification")
            main = pipeline("text-classification", model=model_dir, top_k=None, quantize=config.quantize, **common)
            shared = dict(common, model=main.model, tokenizer=main.tokenizer, max_length=main.max_length)
            pipelines["classify"] = main
            pipelines["classify_raw"] = pipeline("text-classification", top_k=None, function_to_apply="none", **shared)
            # /rerank scores as /predict does (TEI): a sigmoid of one logit, else the last label's probability
            pipelines["rerank"] = pipeline("rerank", activation=main.function_to_apply, **shared)
            pipelines["rerank_raw"] = pipeline("rerank", activation="none", **shared)
            self.id2label = main.id2label
            self.function = main.function_to_apply
            self.hidden_size = main.model.config.hidden_size
        self.pipelines = pipelines
        self.tokenizer = main.tokenizer
        self.max_length = main.max_length
        for kind, pipe in pipelines.items():  # the first call builds kernels and caches: not a client's
            items = ["warm up"] if kind == "embed" else [("warm", "up")]
            pipe.run_features(items, pipe.features(items)[0])
        self.batcher.runners.update({kind: pipe.run_features for kind, pipe in pipelines.items()})

    def stop(self) -> None:
        self.batcher.close(timeout=60)

    def tokenize(self, kind: str, items: list[Any], truncate: bool) -> tuple[list[Any], int]:
        """The features of a request's inputs for the pipeline of `kind`, and their tokens (special tokens
        included; inputs cut to max_length with `truncate`); 413 for an input that is too long without it."""
        pipe = self.pipelines[kind]
        try:
            features, cut = pipe.features(items)
        except BertforgeError as err:
            raise ApiError(422, str(err)) from None
        if cut and not truncate:
            raise self._too_long(items, features)
        return features, sum(len(f.input_ids) for f in features)

    def _too_long(self, items: list[Any], features: list[Any]) -> ApiError:
        """The 413 for the first input that was cut to max_length (its length counted again, untruncated)."""
        for feature in sorted(features, key=lambda f: f.item):
            if len(feature.input_ids) < self.max_length:
                continue
            item = items[feature.item]
            text, pair = item if isinstance(item, tuple) else (item, None)
            n = len(self.tokenizer([text], [pair] if pair is not None else None)["input_ids"][0])
            if n > self.max_length:
                return ApiError(413, f"input {feature.item} has {n} tokens, more than this model takes "
                                     f'({self.max_length}); send "truncate": true to cut it')
        return ApiError(413, f"an input is longer than this model takes ({self.max_length} tokens); "
                             'send "truncate": true to cut it')


# ---------------------------------------------------------------------------------------------------- requests
async def read_json(request: Any, limit: int) -> dict[str, Any]:
    """The request's body as a JSON object; 413 past `limit` bytes, 400 if it is not JSON, 422 if not an object."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise ApiError(413, f"the body is larger than {limit} bytes", "Payload")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the body is larger than {limit} bytes", "Payload")
    try:
        data = json.loads(bytes(body))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the body is not valid JSON ({str(err)[:200]})") from None
    if not isinstance(data, dict):
        raise ApiError(422, f"the body must be a JSON object, got {_json_type(data)}")
    return data


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(value), type(value).__name__)


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(422, f'"{name}" must be true or false, got {_json_type(value)}')
    return value


def _texts(value: Any, name: str, limit: int) -> tuple[list[str], bool]:
    """A string or a non-empty array of strings → (texts, whether it was one string)."""
    if isinstance(value, str):
        return [value], True
    if value is None:
        raise ApiError(422, f'missing "{name}": a string or an array of strings')
    if not isinstance(value, list):
        raise ApiError(422, f'"{name}" must be a string or an array of strings, got {_json_type(value)}')
    if not value:
        raise ApiError(422, f'"{name}" is an empty array')
    if len(value) > limit:
        raise ApiError(413, f'"{name}" has {len(value)} inputs, more than this server takes in one request '
                            f"({limit}); split it", "Payload")
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise ApiError(422, f'"{name}"[{i}] must be a string, got {_json_type(text)}')
    return value, False


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import Response

    body = json.dumps(data, allow_nan=False, separators=(",", ":"))  # ASCII: lone surrogates cannot break it
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def _error_body(path: str, err: ApiError) -> dict[str, Any]:
    if path.startswith("/v1/"):  # OpenAI's error shape, which its client reads
        kind = {400: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
                503: "server_error", 500: "server_error"}.get(err.status, "invalid_request_error")
        return {"error": {"message": err.message, "type": kind, "param": None, "code": None}}
    return {"error": err.message, "error_type": err.kind}


def endpoint(handler: Callable[[Any, Engine], Any]) -> Callable[[Any], Any]:
    """A Starlette endpoint from `handler(request, engine)`: ApiError → its status, anything else → 500; JSON."""

    async def run(request: Any) -> Any:
        engine: Engine = request.app.state.engine
        try:
            return await handler(request, engine)
        except ApiError as err:
            headers = {"Retry-After": "1"} if err.status == 503 else None
            return json_response(_error_body(request.url.path, err), err.status, headers)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("serve: %s failed", request.url.path)
            error = ApiError(500, f"internal error: {type(err).__name__}: {err}"[:500], "Backend")
            return json_response(_error_body(request.url.path, error), 500)

    return run


async def _compute(engine: Engine, request: Any, kind: str, items: list[Any], truncate: bool) -> tuple[list[Any], int]:
    """Tokenize a request's inputs (in a thread for a large body), queue them, wait: their results and tokens."""
    if int(request.headers.get("content-length") or 0) > LARGE_BODY:
        from starlette.concurrency import run_in_threadpool

        features, tokens = await run_in_threadpool(engine.tokenize, kind, items, truncate)
    else:
        features, tokens = engine.tokenize(kind, items, truncate)
    return await engine.batcher.submit(kind, items, features, tokens), tokens


def _need(engine: Engine, task: str, path: str) -> None:
    if engine.task != task:
        what = "an embedding" if engine.task == "embed" else "a sequence-classification"
        need = "an embedding model" if task == "embed" else "a sequence-classification model (--task classify)"
        raise ApiError(400, f"{path} needs {need}; this server has {what} model ({engine.model_name})", "Model")


async def handle_embed(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes)
    _need(engine, "embed", "/embed")
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    normalize = _flag(body, "normalize", True)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, request, "embed", texts, truncate)
    rows = np.stack(results)
    if normalize:
        rows = _normalize(rows)
    from starlette.responses import Response

    return Response(vectors_json(rows), media_type="application/json")


def vectors_json(rows: np.ndarray) -> bytes:
    """float32 rows [n, d] as a JSON array of arrays (`json_bytes`). Non-finite values raise ValueError, as
    `json.dumps(allow_nan=False)` does (orjson would write them as null)."""
    return json_bytes(finite_rows(rows))


def finite_rows(rows: np.ndarray) -> np.ndarray:
    """`rows` as C-ordered float32 (what orjson writes), or ValueError when any value is not finite."""
    if not np.isfinite(rows).all():
        raise ValueError("the model's output has non-finite values; JSON cannot carry them")
    return np.ascontiguousarray(rows, dtype=np.float32)


def json_bytes(data: Any) -> bytes:
    """A response body: `data` (JSON values and float32 numpy arrays) as JSON, each float32 the shortest decimal
    that reads back as the same float32. orjson (the `serve` extra) writes it: about 6 µs for a 384-float vector,
    where `json.dumps` of `_json_floats` takes 120-140 µs, most of the event loop's work on a request. `json`
    writes it where orjson is missing, and where orjson refuses a string (a lone surrogate, as a directory name
    can hold: `json` escapes it)."""
    try:
        import orjson
    except ImportError:
        orjson = None
    if orjson is not None:
        try:
            return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(data, allow_nan=False, separators=(",", ":"), default=_json_array).encode()


def _json_array(value: Any) -> Any:
    """`json.dumps`'s fallback for a numpy array: its `_json_floats` as lists."""
    if isinstance(value, np.ndarray):
        return _json_floats(value).tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_floats(rows: np.ndarray) -> np.ndarray:
    """float32 rows as the float64 values nearest to their 9-significant-digit decimals. JSON then writes each in at
    most 9 digits (a float32 widened to float64 takes up to 17, and its printing is most of a response's time),
    and reads back as the same float32: 9 digits always round-trip a float32, and the one rounding of
    `x * 10**k` can move the decimal by one unit of the 9th digit at most, well within half a float32 step."""
    x = rows.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        digits = 8 - np.floor(np.log10(np.abs(x)))  # decimals that keep 9 significant digits
    exact = np.isfinite(digits) & (np.abs(digits) <= 22)  # 10**k exact: the division rounds once, correctly
    scale = 10.0 ** np.where(exact, digits, 0)
    return np.where(exact, np.round(x * scale) / scale, x)


def _normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)  # as torch.nn.functional.normalize


async def handle_openai_embeddings(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes)
    _need(engine, "embed", "/v1/embeddings")
    value = body.get("input")
    if isinstance(value, list) and value and all(isinstance(x, int) or isinstance(x, list) for x in value):
        raise ApiError(422, '"input" as token ids is not supported: send text')
    texts, _ = _texts(value, "input", engine.config.max_client_batch_size)
    if "model" in body and not isinstance(body["model"], str):
        raise ApiError(422, f'"model" must be a string, got {_json_type(body["model"])}')
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise ApiError(422, f'"encoding_format" must be "float" or "base64", got {encoding!r:.40}')
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool)
                                   or not 1 <= dimensions <= engine.hidden_size):
        raise ApiError(422, f'"dimensions" must be an integer in 1..{engine.hidden_size}, got {dimensions!r:.40}')
    results, total = await _compute(engine, request, "embed", texts, engine.config.auto_truncate)
    rows = np.stack(results)
    if dimensions is not None:
        rows = rows[:, :dimensions]  # Matryoshka: the leading dimensions
    if engine.default_normalize:
        rows = _normalize(rows)
    rows = finite_rows(rows)
    if encoding == "base64":
        vectors: Any = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in rows]
    else:
        vectors = rows  # each row a float32 array, written by `json_bytes`
    from starlette.responses import Response

    return Response(json_bytes({
        "object": "list",
        "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
        "model": engine.model_name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }), media_type="application/json")


def _predict_items(value: Any, limit: int) -> tuple[list[Any], bool]:
    """"inputs" of /predict: a string, or an array of strings and [text, text_pair] arrays."""
    if isinstance(value, str):
        return [value], True
    if value is None:
        raise ApiError(422, 'missing "inputs": a string, or an array of strings and [text, text_pair] pairs')
    if not isinstance(value, list):
        raise ApiError(422, f'"inputs" must be a string or an array, got {_json_type(value)}')
    if not value:
        raise ApiError(422, '"inputs" is an empty array')
    if len(value) > limit:
        raise ApiError(413, f'"inputs" has {len(value)} inputs, more than this server takes in one request ({limit})',
                       "Payload")
    items: list[Any] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            items.append((item[0], item[1]))
        else:
            raise ApiError(422, f'"inputs"[{i}] must be a string or a [text, text_pair] array of two strings')
    return items, False


async def handle_predict(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes)
    _need(engine, "classify", "/predict")
    items, single = _predict_items(body.get("inputs"), engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, request, "classify_raw" if raw else "classify", items, truncate)
    return json_response(results[0] if single else list(results))


async def handle_rerank(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes)
    _need(engine, "classify", "/rerank")
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError(422, f'"query" must be a string, got {_json_type(query)}')
    texts, _ = _texts(body.get("texts"), "texts", engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    return_text = _flag(body, "return_text", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    kind = "rerank_raw" if raw else "rerank"
    scores, _ = await _compute(engine, request, kind, [(query, text) for text in texts], truncate)
    ranked = engine.pipelines[kind].ranking(scores, texts, return_documents=return_text)
    for entry in ranked:  # TEI's name for sentence-transformers' corpus_id
        entry["index"] = entry.pop("corpus_id")
    return json_response(ranked)


async def handle_info(request: Any, engine: Engine) -> Any:
    info: dict[str, Any] = {
        "model_id": engine.model_name,
        "model_type": engine.task,
        "max_input_length": engine.max_length,
        "max_batch_tokens": engine.config.max_batch_tokens,
        "max_client_batch_size": engine.config.max_client_batch_size,
        "max_queue": engine.config.max_queue,
        "auto_truncate": engine.config.auto_truncate,
        "hidden_size": engine.hidden_size,
        "quantize": engine.config.quantize,
    }
    if engine.task == "embed":
        info["normalize_default"] = engine.default_normalize
    else:
        info["labels"] = [engine.id2label[i] for i in range(len(engine.id2label))]
        info["score_function"] = engine.function
    return json_response(info)


async def handle_health(request: Any, engine: Engine) -> Any:
    if not engine.batcher.alive or engine.batcher.closing:
        raise ApiError(503, "the model worker is not running", "Unhealthy")
    return json_response({"status": "ok", "model": engine.model_name, "task": engine.task,
                          "queue_depth": engine.batcher.depth()})


async def handle_metrics(request: Any, engine: Engine) -> Any:
    from starlette.responses import Response

    text = engine.metrics.render(engine.batcher.depth(), engine.config.max_queue, engine.batcher.in_flight)
    return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")


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


def _require_server_stack() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
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

    async def http_error(request: Any, exc: Any) -> Any:
        error = ApiError(exc.status_code, exc.detail or "error", "Http")
        return json_response(_error_body(request.url.path, error), exc.status_code, exc.headers)

    routes = [
        Route("/embed", endpoint(handle_embed), methods=["POST"]),
        Route("/predict", endpoint(handle_predict), methods=["POST"]),
        Route("/rerank", endpoint(handle_rerank), methods=["POST"]),
        Route("/v1/embeddings", endpoint(handle_openai_embeddings), methods=["POST"]),
        Route("/info", endpoint(handle_info), methods=["GET"]),
        Route("/health", endpoint(handle_health), methods=["GET"]),
        Route("/metrics", endpoint(handle_metrics), methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.engine = engine
    app.add_middleware(MetricsMiddleware, metrics=engine.metrics)
    return app


def _tune_serving_process() -> None:
    """Two process-wide settings of a serving process.

    The GIL: the model thread gives up the GIL in every torch op and needs it back after each; while the event loop
    runs Python (parsing requests, writing answers) it would wait up to the switch interval every time, with the
    torch threads idle. A serving process therefore switches every 0.5 ms instead of 5 ms (at 32 clients on the
    loaded 2-core machine: 117 against 104 requests/s, medians of 6 paired rounds).

    Memory: glibc keeps freed memory for reuse (`system.reuse_freed_memory`, as the embed, predict and evaluate
    commands do), so a forward's large tensors are not fresh pages each time (int8 layers: 1.36x against 1.80x
    float32's speed without and with it, all-MiniLM-L6-v2, 2026-11-25)."""
    from .system import reuse_freed_memory

    sys.setswitchinterval(SWITCH_INTERVAL)
    reuse_freed_memory()


def app_from_environment() -> Any:
    """The app for uvicorn's import-string factory (`--workers N`): options from $BERTFORGE_SERVE_CONFIG."""
    text = os.environ.get(ENV_CONFIG)
    if not text:
        raise BertforgeError(f"${ENV_CONFIG} is not set: start the server with `bertforge serve`")
    _tune_serving_process()
    return create_app(ServeConfig.from_json(text))


def run_server(config: ServeConfig, host: str = "127.0.0.1", port: int = 8080, workers: int = 1,
               log_level: str = "info", graceful_timeout: float | None = 30.0) -> int:
    """Serve until SIGTERM or SIGINT; in-flight requests finish first. Returns 0 after a clean shutdown."""
    _require_server_stack()
    import uvicorn

    if workers < 1:
        raise BertforgeError(f"serve: workers must be at least 1, got {workers}")
    if not 0 <= port <= 65535:
        raise BertforgeError(f"serve: port must be in 0..65535, got {port}")
    options = dict(host=host, port=port, log_level=log_level, timeout_graceful_shutdown=graceful_timeout,
                   lifespan="on", access_log=False, server_header=False)
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
        from .system import available_cpus

        config.num_threads = max(1, available_cpus() // workers)  # the processes share the machine's cores
    Engine(config).stop()  # check the model once here: uvicorn would restart failing workers forever
    os.environ[ENV_CONFIG] = config.to_json()
    uvicorn.run("bertforge.serve:app_from_environment", factory=True, workers=workers, **options)
    return 0
