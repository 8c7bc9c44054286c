"""The endpoints: one handler per route, `handler(request, engine)`, and `endpoint`, which turns each into a
Starlette endpoint answering errors as JSON."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import time
from contextvars import ContextVar
from collections.abc import Callable
from typing import Any

import numpy as np

from .engine import TRUNCATE_HINT, Engine
from .errors import TIMED_OUT, ApiError, _error_body, backend, batch_too_large, empty, invalid
from .metrics import CONTENT_TYPE
from .requests import (_dimensions, _flag, _inputs, _json_type, _left, _predict_items, _prompt_name, _texts,
                       read_json)
from .responses import finite_rows, json_bytes, json_response, vectors_json

log = logging.getLogger("bertforge")

#: Requests of more characters than this (and bodies of more bytes) are parsed and tokenized in a thread, so that
#: no request holds the event loop (every other client, /health included) for more than a few milliseconds.
LARGE_REQUEST = 64 * 1024
#: The status a request gets in /metrics when its client hung up before the answer (nginx's "client closed
#: request"); the client never sees it.
CLIENT_CLOSED = 499


def endpoint(handler: Callable[[Any, Engine], Any]) -> Callable[[Any], Any]:
    """A Starlette endpoint from `handler(request, engine)`: ApiError → its status, anything else → TEI's 424
    Backend; JSON.
    A client that hung up (or whose body missed its deadline: `TIMED_OUT`) is counted as 499 (408)."""
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response

    async def run(request: Any) -> Any:
        engine: Engine = request.app.state.engine
        timing: dict[str, float] = {}
        TIMING.set(timing)  # this request's task only
        start = time.perf_counter()
        try:
            response = await handler(request, engine)
            if "tokens" in timing:
                device = str(getattr(engine, "device_type", "cpu"))
                response.headers.update(_timing_headers(timing, time.perf_counter() - start, device))
            return response
        except ApiError as err:
            headers = {"Retry-After": "1"} if err.status in (429, 503) else None
            return json_response(_error_body(request.url.path, err), err.status, headers)
        except ClientDisconnect:  # nobody to answer: the status is for /metrics only
            timed_out = request.scope.get(TIMED_OUT, False)
            log.debug("serve: %s: the client %s", request.url.path,
                      "sent its body too slowly" if timed_out else "hung up before its body was read")
            return Response(status_code=408 if timed_out else CLIENT_CLOSED)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("serve: %s failed", request.url.path)
            error = backend(f"Inference failed: {type(err).__name__}: {err}"[:500])  # TEI's 424
            return json_response(_error_body(request.url.path, error), error.status)

    return run


async def _compute(engine: Engine, kind: str, items: list[Any], truncate: bool, hint: str = TRUNCATE_HINT,
                   left: bool = False, max_tokens: int | None = None, prompt: str = "") -> tuple[list[Any], int]:
    """Tokenize a request's inputs (in a thread for a large request), queue them, wait: their results and tokens.
    `hint`: what the client can do about an input that is too long, on its route; `left`: cut its start;
    `max_tokens`: a request of more tokens gets 422 before it is queued; `prompt`: put before each text."""
    chars = sum(len(x) for item in items for x in (item if isinstance(item, tuple) else (item,))
                if isinstance(x, str))
    timing = TIMING.get()
    begin = time.perf_counter()
    if chars > LARGE_REQUEST:
        from starlette.concurrency import run_in_threadpool

        items, features, tokens = await run_in_threadpool(engine.tokenize, kind, items, truncate, hint, left, prompt)
    else:
        items, features, tokens = engine.tokenize(kind, items, truncate, hint, left, prompt)
    if max_tokens is not None and tokens > max_tokens:
        raise invalid(f"the inputs hold {tokens} tokens, more than this route answers for in one request "
                      f"({max_tokens}, --max-batch-tokens); send fewer inputs per request")
    job: dict[str, float] = {}
    results = await engine.batcher.submit(kind, items, features, tokens, job)
    if timing is not None:  # TEI's x-compute-* and x-*-time headers (`_timing_headers`), summed over the request
        done = time.perf_counter()
        started = job.get("started", done)
        for key, value in (("chars", chars), ("tokens", tokens), ("tokenization", job.get("queued", begin) - begin),
                           ("queue", started - job.get("queued", started)), ("inference", done - started)):
            timing[key] = timing.get(key, 0) + value
    return results, tokens


#: The request's timings and sizes, for TEI's response headers (set by `endpoint`, filled by `_compute`).
TIMING: ContextVar[dict[str, float] | None] = ContextVar("bertforge_serve_timing", default=None)


def _timing_headers(timing: dict[str, float], total: float, device: str) -> dict[str, str]:
    """TEI's headers of an answer: x-compute-type, -characters, -tokens, x-total-time, x-tokenization-time,
    x-queue-time, x-inference-time (milliseconds; x-compute-time: total less the queue)."""
    ms = {key: str(int(timing.get(key, 0) * 1000)) for key in ("tokenization", "queue", "inference")}
    return {"x-compute-type": device, "x-compute-characters": str(int(timing.get("chars", 0))),
            "x-compute-tokens": str(int(timing.get("tokens", 0))), "x-total-time": str(int(total * 1000)),
            "x-compute-time": str(int((total - timing.get("queue", 0)) * 1000)),
            "x-tokenization-time": ms["tokenization"], "x-queue-time": ms["queue"],
            "x-inference-time": ms["inference"]}


async def off_loop(build: Callable[[], Any]) -> Any:
    """`build()` in a worker thread: an answer's JSON is written off the event loop, so /health and every other
    client go on being answered while it is built."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(build)


#: TEI's refusal of a route the model's kind does not answer (424 Backend), by the kind the route needs.
NOT_THE_MODEL = {"embedding": "Model is not an embedding model", "classifier": "Model is not a classifier model",
                 "reranker": "model is not a re-ranker model",
                 "sparse": "Model is not an embedding model with SPLADE pooling"}


def _need(engine: Engine, kind: str, path: str) -> None:
    """424 Backend unless the model answers `path`: `kind` is "embedding" (an embedding model), "classifier" (a
    sequence-classification model: /predict answers rerankers too), "reranker" (one label) or "sparse"."""
    have = engine.model_kind
    if kind == "sparse":
        ok = engine.task == "embed" and engine.sparse
    elif kind == "classifier":
        ok = have in ("classifier", "reranker")
    else:
        ok = have == kind
    if not ok:
        what = "a sparse embedding" if engine.sparse else {"embedding": "an embedding", "classifier": "a classifier",
                                                           "reranker": "a re-ranker (one label)"}[have]
        raise backend(f"{NOT_THE_MODEL[kind]}: {path} needs {NEEDS[kind]}; this server's model ({engine.model_name}) "
                      f"is {what} model")


NEEDS = {"embedding": "an embedding model", "classifier": "a sequence-classification model (--task classify)",
         "reranker": "a cross-encoder: a sequence-classification model with one label",
         "sparse": "a SPLADE model, or a masked-LM checkpoint served with --pooling splade"}


def _vectors(rows: np.ndarray) -> Any:
    from starlette.responses import Response

    return Response(vectors_json(rows), media_type="application/json")


async def handle_embed(request: Any, engine: Engine) -> Any:
    return await embed(await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST), engine)


async def embed(body: dict[str, Any], engine: Engine) -> Any:
    """TEI's `/embed`: `EmbedRequest` → `[[float, ...], ...]`, one pooled vector per input."""
    _need(engine, "embedding", "/embed")
    inputs, _ = _inputs(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    normalize = _flag(body, "normalize", True)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    dimensions = _dimensions(body, engine.hidden_size)
    prompt = engine.prompt(_prompt_name(body))
    results, _ = await _compute(engine, engine.kind("embed", body.get("adapter")), inputs, truncate,
                                left=_left(body), prompt=prompt)
    rows = np.stack(results)
    if dimensions is not None:
        rows = rows[:, :dimensions]  # Matryoshka: the leading dimensions, then normalised (as TEI does)
    if normalize:
        rows = _normalize(rows)
    return _vectors(rows)


def _normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)  # as torch.nn.functional.normalize


async def handle_openai_embeddings(request: Any, engine: Engine) -> Any:
    """TEI's `/v1/embeddings` (OpenAI's API): `OpenAICompatRequest` → `OpenAICompatResponse`; the vectors are
    always normalised (TEI's rule), inputs truncated as --auto-truncate says (no per-request "truncate")."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embedding", "/v1/embeddings")
    inputs, _ = _inputs(body.get("input"), "input", engine.config.max_client_batch_size)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(f'"model" must be a string or null, got {_json_type(model)}')
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise invalid(f'"encoding_format" must be "float" or "base64", got {encoding!r:.40}')
    dimensions = _dimensions(body, engine.hidden_size)
    # an adapter's name picks it (bertforge's addition); any other name, or none, the base model (TEI only warns)
    adapter = model if model in engine.config.adapters else None
    results, total = await _compute(engine, engine.kind("embed", adapter), inputs, engine.config.auto_truncate,
                                    "shorten it", prompt=engine.prompt(None))
    rows = np.stack(results)
    if dimensions is not None:
        rows = rows[:, :dimensions]  # Matryoshka: the leading dimensions
    rows = finite_rows(_normalize(rows))
    if encoding == "base64":
        vectors: Any = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in rows]
    else:
        vectors = rows  # each row a float32 array, written by `json_bytes`
    from starlette.responses import Response

    return Response(json_bytes({
        "object": "list",
        "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
        "model": adapter or engine.model_name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }), media_type="application/json")


async def handle_predict(request: Any, engine: Engine) -> Any:
    return await predict(await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST), engine)


async def predict(body: dict[str, Any], engine: Engine) -> Any:
    """TEI's `/predict`: `PredictRequest` → `[{"score", "label"}, ...]` (one input) or one such list per input."""
    _need(engine, "classifier", "/predict")
    items, single = _predict_items(body.get("inputs"), engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    kind = engine.kind("classify_raw" if raw else "classify", body.get("adapter"))
    results, _ = await _compute(engine, kind, items, truncate, left=_left(body))
    label_ids = {label: i for i, label in engine.id2label.items()}
    # TEI's order: best first, ties the later label first (it sorts ascending, then reverses)
    results = [sorted(r, key=lambda p: (p["score"], label_ids.get(p["label"], 0)), reverse=True) for r in results]
    return json_response(results[0] if single else list(results))


async def handle_rerank(request: Any, engine: Engine) -> Any:
    return await rerank(await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST), engine)


async def rerank(body: dict[str, Any], engine: Engine) -> Any:
    """TEI's `/rerank` (a cross-encoder: a one-label classifier): `RerankRequest` → `[{"index", "score"(,
    "text")}]`, best first."""
    query, texts = body.get("query"), body.get("texts")
    if not isinstance(query, str):
        raise invalid(f'"query" must be a string, got {_json_type(query)}')
    if isinstance(texts, list) and not texts:
        raise empty("`texts` cannot be empty")
    _need(engine, "reranker", "/rerank")
    texts, _ = _texts(texts, "texts", engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    return_text = _flag(body, "return_text", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    kind = engine.kind("rerank_raw" if raw else "rerank", body.get("adapter"))
    scores, _ = await _compute(engine, kind, [(query, text) for text in texts], truncate, left=_left(body))
    # TEI's order: by score, best first, ties the later text first (it sorts ascending, then reverses)
    order = sorted(range(len(texts)), key=lambda i: (scores[i], i), reverse=True)
    ranked = [{"index": i, "score": scores[i], **({"text": texts[i]} if return_text else {})} for i in order]
    return json_response(ranked)


def default_route(engine: Engine) -> str:
    """The route `POST /` (and SageMaker's `/invocations`) is, by TEI's rule: /predict for a classifier, /rerank
    for a reranker; for an embedding model /similarity where $TASK is "sentence-similarity", /embed_sparse for a
    sparse model, else /embed."""
    if engine.model_kind == "classifier":
        return "/predict"
    if engine.model_kind == "reranker":
        return "/rerank"
    if os.environ.get("TASK") == "sentence-similarity":
        return "/similarity"
    return "/embed_sparse" if engine.sparse else "/embed"


async def handle_default(request: Any, engine: Engine) -> Any:
    """TEI's `POST /` (and SageMaker's `/invocations`): the model's own route (`default_route`)."""
    from .tei import embed_sparse, similarity

    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    route = {"/predict": predict, "/rerank": rerank, "/similarity": similarity, "/embed_sparse": embed_sparse,
             "/embed": embed}[default_route(engine)]
    return await route(body, engine)


async def handle_vertex(request: Any, engine: Engine) -> Any:
    """TEI's `/vertex` (Google Vertex AI): `{"instances": [request, ...]}` → `{"predictions": [answer, ...]}`, each
    instance a /rerank request (one with "query" and "texts") or one of the model's own route (/predict, or
    /embed_sparse for a sparse model, else /embed). At most --max-client-batch-size instances."""
    from .tei import embed_sparse

    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    instances = body.get("instances")
    if not isinstance(instances, list):
        raise invalid(f'"instances" must be an array of requests, got {_json_type(instances)}')
    limit = engine.config.max_client_batch_size
    if len(instances) > limit:
        raise batch_too_large(len(instances), limit)
    for i, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise invalid(f'"instances"[{i}] must be an object (a request), got {_json_type(instance)}')
    if engine.sparse:  # sparse answers are vocabulary-sized: their sum is bounded as /embed_sparse's is
        inputs = sum(len(x["inputs"]) if isinstance(x.get("inputs"), list) and not all(
            isinstance(t, int) for t in x["inputs"]) else 1 for x in instances if "texts" not in x)
        vocab, most = engine.tokenizer.vocab_size, engine.config.max_response_values
        if inputs * vocab > most:
            raise invalid(f"{inputs} inputs of {vocab} sparse values each may answer more than "
                          f"--max-response-values ({most}); send fewer instances")
    answers = []
    for instance in instances:
        if "query" in instance and "texts" in instance:
            route: Any = rerank
        elif engine.model_kind != "embedding":
            route = predict
        else:
            route = embed_sparse if engine.sparse else embed
        answers.append(await route(instance, engine))
    from starlette.responses import Response

    return Response(b'{"predictions":[' + b",".join(bytes(a.body) for a in answers) + b"]}",
                    media_type="application/json")


def _label_maps(engine: Engine) -> dict[str, Any]:
    labels = [engine.id2label[i] for i in range(len(engine.id2label))]
    return {"id2label": {str(i): label for i, label in enumerate(labels)},
            "label2id": {label: i for i, label in enumerate(labels)}}


async def handle_info(request: Any, engine: Engine) -> Any:
    """TEI's `Info`, then bertforge's additions (`max_input_chars`, `hidden_size`, ...)."""
    from .. import __version__

    config = engine.config
    model_type: dict[str, Any] = {"embedding": {"pooling": engine.pooling}} if engine.model_kind == "embedding" \
        else {engine.model_kind: _label_maps(engine)}
    info: dict[str, Any] = {
        "model_id": config.model,
        "model_sha": None,
        "model_dtype": engine.dtype,
        "served_model_name": engine.model_name,
        "model_type": model_type,
        "max_concurrent_requests": config.max_queue,
        "max_input_length": engine.max_length,
        "max_batch_tokens": config.max_batch_tokens,
        "max_batch_requests": config.max_batch_requests,
        "max_client_batch_size": config.max_client_batch_size,
        "auto_truncate": config.auto_truncate,
        "tokenization_workers": engine.tokenization_workers,
        "version": __version__,
        "sha": None,
        "docker_label": None,
        # bertforge's additions
        "server": "bertforge",
        "max_input_chars": engine.max_chars,
        "hidden_size": engine.hidden_size,
        "quantize": config.quantize,
    }
    if engine.task == "embed":
        info["normalize_default"] = engine.default_normalize
        info["sparse"] = engine.sparse
        info["prompts"] = sorted(engine.prompts)
    else:
        info["labels"] = [engine.id2label[i] for i in range(len(engine.id2label))]
        info["score_function"] = engine.function
    if config.adapters:
        info["adapters"] = sorted(config.adapters)
    return json_response(info)


async def handle_health(request: Any, engine: Engine) -> Any:
    if not engine.batcher.alive or engine.batcher.closing:
        raise ApiError(None, "unhealthy", "Unhealthy")
    return json_response({"status": "ok", "model": engine.model_name, "task": engine.task,
                          "queue_depth": engine.batcher.depth()})


async def handle_metrics(request: Any, engine: Engine) -> Any:
    from starlette.responses import Response

    return Response(engine.metrics.render(), media_type=CONTENT_TYPE)
