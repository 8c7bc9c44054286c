"""`bertforge serve`: a model behind HTTP, on uvicorn + Starlette.

It behaves as text-embeddings-inference 1.9 (TEI) does (its source at v1.9.3 is the contract; the conformance
tests validate every answer against TEI's OpenAPI document). Endpoints (JSON in, JSON out), declared once in
`openapi.ROUTES`, from which the app and its OpenAPI document (`/api-doc/openapi.json`, Swagger UI at `/docs`) are
built:

* TEI's API: `POST /embed`, `/embed_all` (every token's vector), `/embed_sparse` (a SPLADE model, or a masked-LM
  one with `--pooling splade`), `/similarity`, `/predict` (classifiers and rerankers), `/rerank` (a one-label
  cross-encoder), `/tokenize`, `/decode`, `/vertex`, `GET /info` (TEI's `Info`), `/health`, `/metrics` (`te_*`
  names; with `--workers N` summed over the workers through `prometheus_client`'s multi-process mode);
* its OpenAI route: `POST /v1/embeddings` (and `/embeddings`), always normalised, errors in TEI's flat
  `OpenAICompatErrorResponse`;
* its hosted-endpoint routes: `POST /` and `/invocations` (the model kind's route; `$TASK=sentence-similarity`:
  /similarity), `GET /` and `/ping` (health).

Errors carry TEI's error types only (`errors.STATUS`: Unhealthy 503, Backend 424, Overloaded 429, Validation and
Tokenizer 422, Empty 400); TEI's defaults hold (auto-truncate on, 32 inputs a request, 16,384 tokens a batch).

`--api-key KEY` (`ServeConfig.api_key`): every route but the public ones (health probes, /metrics, /docs) needs
`Authorization: Bearer KEY`.

Dynamic batching: a request is validated and tokenized once, into the pipeline's features (their lengths size the
batches), then queued; a large one (by its characters, and its body by its bytes, however it was sent) is parsed and
tokenized in a thread, so no request holds the event loop for more than a few milliseconds. One worker thread takes the oldest waiting request and every later one of
the same kind that still fits under `max_batch_tokens`, runs their features as one `run_features` call of the
pipeline (which sorts by length and packs without padding; no tokenizing), and hands each request its rows, all of
a batch's answers in one wake-up of the event loop. While one batch computes, the next one gathers: with one client
there is no waiting at all, with many the batches grow by themselves. Vectors are written to JSON with 9 significant
digits, which read back as the same float32 (17-digit float64 text was among the largest costs of a response).

Back-pressure: at most `max_queue` requests wait (TEI's `--max-concurrent-requests`); one more gets 429 at once (with
`Retry-After`), as TEI answers. Bodies over `max_body_bytes` get 413, more than `max_client_batch_size` inputs and
(with `"truncate": false`) inputs longer than the model takes TEI's 422, an empty batch its 400, always with a JSON
error that says what the client can do on its route. Every answer is bounded (`max_batch_tokens`,
`max_response_values`) and large ones are written in worker threads. An input past `max_input_chars` characters is
refused, or cut with `truncate`, before any tokenizing:
a request costs in proportion to what the model reads. A request's head and body must arrive within
`head_timeout` and `body_timeout` (408, then the connection is closed), and connections past `max_connections` get
503 at once (`connections.GuardedProtocol`). A client that hangs up before its body is read is counted as 499. A failing batch is retried one
request at a time, so one bad request cannot fail the others; whatever fails gets TEI's 424 Backend error and the
server goes on serving.

SIGTERM: uvicorn stops accepting, lets in-flight requests finish, the worker drains its queue, exit status 0.
Several processes: `--workers N` runs uvicorn's process supervisor with `app_from_environment` as an import-string
factory; the options travel in the environment variable `BERTFORGE_SERVE_CONFIG` (JSON).

Modules: `config` (ServeConfig), `errors` (ApiError and its JSON shapes), `metrics` (Prometheus counters and the
middleware), `batcher` (the queue and its worker thread), `engine` (the model's pipelines), `requests` (reading and
checking bodies), `responses` (JSON and float32 vectors), `handlers` (one per route; TEI's token, sparse and
similarity routes in `tei`), `auth` (the API key), `openapi` (the route table and the OpenAPI document), `connections` (deadlines and
the connection cap in uvicorn's HTTP protocol; imports uvicorn), `app` (the Starlette app and the uvicorn process).
"""

from __future__ import annotations

from .app import SWITCH_INTERVAL, app_from_environment, create_app, run_server
from .batcher import Batcher, Job
from .config import ENV_CONFIG, TASKS, ServeConfig
from .engine import Engine, detect_task
from .errors import TIMED_OUT, ApiError, Overloaded
from .handlers import CLIENT_CLOSED, LARGE_REQUEST, endpoint
from .metrics import MULTIPROC_ENV, ROUTES, Metrics, MetricsMiddleware
from .requests import read_json
from .responses import _json_floats, finite_rows, json_bytes, json_response, vectors_json  # noqa: F401 (_json_floats: for its test)

__all__ = [
    "CLIENT_CLOSED", "ENV_CONFIG", "LARGE_REQUEST", "MULTIPROC_ENV", "ROUTES", "SWITCH_INTERVAL", "TASKS", "TIMED_OUT",
    "ApiError", "Batcher", "Engine", "Job", "Metrics", "MetricsMiddleware", "Overloaded", "ServeConfig",
    "app_from_environment", "create_app", "detect_task", "endpoint", "finite_rows", "json_bytes", "json_response",
    "read_json", "run_server", "vectors_json",
]
