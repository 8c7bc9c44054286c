"""The endpoints: one handler per route, `handler(request, engine)`, and `endpoint`, which turns each into a
Starlette endpoint answering errors as JSON."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from .engine import TRUNCATE_HINT, Engine
from .errors import TIMED_OUT, ApiError, _error_body
from .metrics import CONTENT_TYPE
from .requests import _dimensions, _flag, _json_type, _left, _no_prompt, _predict_items, _texts, read_json
from .responses import finite_rows, json_bytes, json_response, vectors_json

log = logging.getLogger("bertforge")

#: Requests of more characters than this (and bodies of more bytes) are parsed and tokenized in a thread, so that
#: no request holds the event loop (every other client, /health included) for more than a few milliseconds.
LARGE_REQUEST = 64 * 1024
#: The status a request gets in /metrics when its client hung up before the answer (nginx's "client closed
#: request"); the client never sees it.
CLIENT_CLOSED = 499


def endpoint(handler: Callable[[Any, Engine], Any]) -> Callable[[Any], Any]:
    """A Starlette endpoint from `handler(request, engine)`: ApiError → its status, anything else → 500; JSON.
    A client that hung up (or whose body missed its deadline: `TIMED_OUT`) is counted as 499 (408)."""
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response

    async def run(request: Any) -> Any:
        engine: Engine = request.app.state.engine
        try:
            return await handler(request, engine)
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
            error = ApiError(500, f"internal error: {type(err).__name__}: {err}"[:500], "Backend")
            return json_response(_error_body(request.url.path, error), 500)

    return run


async def _compute(engine: Engine, kind: str, items: list[Any], truncate: bool, hint: str = TRUNCATE_HINT,
                   left: bool = False, max_tokens: int | None = None) -> tuple[list[Any], int]:
    """Tokenize a request's inputs (in a thread for a large request), queue them, wait: their results and tokens.
    `hint`: what the client can do about an input that is too long, on its route; `left`: cut its start;
    `max_tokens`: a request of more tokens gets 413 before it is queued."""
    chars = sum(len(x) for item in items for x in (item if isinstance(item, tuple) else (item,)))
    if chars > LARGE_REQUEST:
        from starlette.concurrency import run_in_threadpool

        items, features, tokens = await run_in_threadpool(engine.tokenize, kind, items, truncate, hint, left)
    else:
        items, features, tokens = engine.tokenize(kind, items, truncate, hint, left)
    if max_tokens is not None and tokens > max_tokens:
        raise ApiError(413, f"the inputs hold {tokens} tokens, more than this route answers for in one request "
                            f"({max_tokens}, --max-batch-tokens); send fewer inputs per request", "Payload")
    return await engine.batcher.submit(kind, items, features, tokens), tokens


def _need(engine: Engine, task: str, path: str) -> None:
    if engine.task != task:
        what = "an embedding" if engine.task == "embed" else "a sequence-classification"
        need = "an embedding model" if task == "embed" else "a sequence-classification model (--task classify)"
        raise ApiError(400, f"{path} needs {need}; this server has {what} model ({engine.model_name})", "Model")


async def handle_embed(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embed", "/embed")
    _no_prompt(body)
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    normalize = _flag(body, "normalize", True)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    dimensions = _dimensions(body, engine.hidden_size)
    results, _ = await _compute(engine, engine.kind("embed", body.get("adapter")), texts, truncate, left=_left(body))
    rows = np.stack(results)
    if dimensions is not None:
        rows = rows[:, :dimensions]  # Matryoshka: the leading dimensions, then normalised (as TEI does)
    if normalize:
        rows = _normalize(rows)
    from starlette.responses import Response

    return Response(vectors_json(rows), media_type="application/json")


def _normalize(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)  # as torch.nn.functional.normalize


async def handle_openai_embeddings(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
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
    dimensions = _dimensions(body, engine.hidden_size)
    model = body.get("model")  # an adapter's name picks it; the base's name, or any with no adapters, the base
    adapter = model if engine.config.adapters and model not in (None, engine.model_name) else None
    results, total = await _compute(engine, engine.kind("embed", adapter), texts, engine.config.auto_truncate,
                                    "shorten it")
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
        "model": adapter or engine.model_name,
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }), media_type="application/json")


async def handle_predict(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "classify", "/predict")
    items, single = _predict_items(body.get("inputs"), engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    kind = engine.kind("classify_raw" if raw else "classify", body.get("adapter"))
    results, _ = await _compute(engine, kind, items, truncate, left=_left(body))
    return json_response(results[0] if single else list(results))


async def handle_rerank(request: Any, engine: Engine) -> Any:
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "classify", "/rerank")
    query = body.get("query")
    if not isinstance(query, str):
        raise ApiError(422, f'"query" must be a string, got {_json_type(query)}')
    texts, _ = _texts(body.get("texts"), "texts", engine.config.max_client_batch_size)
    raw = _flag(body, "raw_scores", False)
    return_text = _flag(body, "return_text", False)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    kind = engine.kind("rerank_raw" if raw else "rerank", body.get("adapter"))
    scores, _ = await _compute(engine, kind, [(query, text) for text in texts], truncate, left=_left(body))
    ranked = engine.pipelines[kind].ranking(scores, texts, return_documents=return_text)
    for entry in ranked:  # TEI's name for sentence-transformers' corpus_id
        entry["index"] = entry.pop("corpus_id")
    return json_response(ranked)


async def handle_default(request: Any, engine: Engine) -> Any:
    """TEI's `POST /` (and SageMaker's `/invocations`): the model's own route, /embed or /predict."""
    return await (handle_embed if engine.task == "embed" else handle_predict)(request, engine)


async def handle_info(request: Any, engine: Engine) -> Any:
    info: dict[str, Any] = {
        "model_id": engine.model_name,
        "model_type": engine.task,
        "max_input_length": engine.max_length,
        "max_input_chars": engine.max_chars,
        "max_batch_tokens": engine.config.max_batch_tokens,
        "max_client_batch_size": engine.config.max_client_batch_size,
        "max_queue": engine.config.max_queue,
        "max_concurrent_requests": engine.config.max_queue,  # TEI's name for it
        "auto_truncate": engine.config.auto_truncate,
        "hidden_size": engine.hidden_size,
        "quantize": engine.config.quantize,
    }
    if engine.task == "embed":
        info["normalize_default"] = engine.default_normalize
        info["sparse"] = "embed_sparse" in engine.pipelines  # /embed_sparse answers (an MLM head)
    else:
        info["labels"] = [engine.id2label[i] for i in range(len(engine.id2label))]
        info["score_function"] = engine.function
    if engine.config.adapters:
        info["adapters"] = sorted(engine.config.adapters)
    return json_response(info)


async def handle_health(request: Any, engine: Engine) -> Any:
    if not engine.batcher.alive or engine.batcher.closing:
        raise ApiError(503, "the model worker is not running", "Unhealthy")
    return json_response({"status": "ok", "model": engine.model_name, "task": engine.task,
                          "queue_depth": engine.batcher.depth()})


async def handle_metrics(request: Any, engine: Engine) -> Any:
    from starlette.responses import Response

    return Response(engine.metrics.render(), media_type=CONTENT_TYPE)
