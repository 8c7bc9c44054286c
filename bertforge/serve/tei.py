"""text-embeddings-inference's other routes: `/embed_all` (every token's vector), `/embed_sparse` (SPLADE),
`/similarity` (cosine of pooled embeddings), and the tokenizer's `/tokenize` and `/decode`. Bodies, answers and
error shapes are TEI's (`router/src/http/types.rs`); limits, truncation and batching are those of the other routes
(`handlers`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .engine import Engine
from .errors import ApiError
from .handlers import LARGE_REQUEST, _compute, _need
from .requests import _flag, _ids, _json_type, _left, _no_prompt, _texts, read_json
from .responses import _json_floats, finite_rows, json_bytes, json_response


async def handle_embed_all(request: Any, engine: Engine) -> Any:
    """Every token's last hidden state, special tokens included: `[[[float, ...], ...], ...]`, one array of
    token vectors per input (the feature-extraction pipeline's). The answer grows with the tokens, not the inputs:
    a request may hold at most `max_batch_tokens` of them (413 past it), so one answer stays within about
    10 bytes x max_batch_tokens x hidden size."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embed", "/embed_all")
    _no_prompt(body)
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, engine.kind("embed_all", body.get("adapter")), texts, truncate, left=_left(body),
                                max_tokens=engine.config.max_batch_tokens)
    from starlette.responses import Response

    return Response(json_bytes([finite_rows(rows) for rows in results]), media_type="application/json")


async def handle_embed_sparse(request: Any, engine: Engine) -> Any:
    """SPLADE vectors from the MLM head: `[[{"index": int, "value": float}, ...], ...]`, the non-zero entries of
    each input's vocabulary-sized vector, by index. A model without an MLM head gets TEI's 424."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embed", "/embed_sparse")
    if "embed_sparse" not in engine.pipelines:
        raise ApiError(424, f"/embed_sparse needs a model with an MLM head (SPLADE: a checkpoint saved from "
                            f"BertForMaskedLM); this server's model ({engine.model_name}) has none", "Backend")
    _no_prompt(body)
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, "embed_sparse", texts, truncate, left=_left(body))
    answer = []
    for row in results:
        indices = np.flatnonzero(row)
        values = _json_floats(finite_rows(row[indices][None]))[0]  # float32 as its shortest decimals
        answer.append([{"index": int(i), "value": v} for i, v in zip(indices.tolist(), values.tolist())])
    return json_response(answer)


async def handle_similarity(request: Any, engine: Engine) -> Any:
    """`{"inputs": {"source_sentence": str, "sentences": [str]}, "parameters": {"truncate", ...}}` → the cosine
    similarity of the source's pooled embedding with each sentence's: `[float, ...]`."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embed", "/similarity")
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise ApiError(422, f'"inputs" must be an object {{"source_sentence": str, "sentences": [str]}}, got '
                            f"{_json_type(inputs)}")
    source = inputs.get("source_sentence")
    if not isinstance(source, str):
        raise ApiError(422, f'"inputs.source_sentence" must be a string, got {_json_type(source)}')
    sentences = inputs.get("sentences")
    if not isinstance(sentences, list):  # one string is not TEI's shape
        raise ApiError(422, f'"inputs.sentences" must be an array of strings, got {_json_type(sentences)}')
    limit = engine.config.max_client_batch_size
    if len(sentences) + 1 > limit:
        raise ApiError(413, f'"inputs.sentences" and the source make {len(sentences) + 1} inputs, more than this '
                            f"server takes in one request ({limit}); split it", "Payload")
    texts, _ = _texts(sentences, "inputs.sentences", limit)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise ApiError(422, f'"parameters" must be an object, got {_json_type(parameters)}')
    _no_prompt(parameters)
    truncate = _flag(parameters, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, "embed", [source, *texts], truncate, left=_left(parameters))
    rows = np.stack(results).astype(np.float64)
    norms = np.maximum(np.linalg.norm(rows, axis=1), 1e-12)
    cosines = rows[1:] @ rows[0] / (norms[1:] * norms[0])
    return json_response(cosines.tolist())


async def handle_tokenize(request: Any, engine: Engine) -> Any:
    """`{"inputs": str | [str], "add_special_tokens": true}` → one list of tokens per input, each `{"id", "text",
    "special", "start", "stop"}`: start and stop are byte offsets into the UTF-8 input (null for special
    tokens), as TEI answers. Inputs past `max_input_chars` get 413; nothing is truncated."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _no_prompt(body)
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    special = _flag(body, "add_special_tokens", True)
    texts = engine.bound(texts, truncate=False, hint="shorten it")
    if sum(len(text) for text in texts) > LARGE_REQUEST:
        from starlette.concurrency import run_in_threadpool

        return json_response(await run_in_threadpool(_tokens, engine, texts, special))
    return json_response(_tokens(engine, texts, special))


def _tokens(engine: Engine, texts: list[str], special: bool) -> list[list[dict[str, Any]]]:
    tokenizer = engine.tokenizer
    enc = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=True, return_special_tokens_mask=True)
    answer = []
    for text, ids, offsets, specials in zip(texts, enc["input_ids"], enc["offset_mapping"],
                                            enc["special_tokens_mask"]):
        to_bytes = _byte_offsets(text)
        tokens = []
        for token, (start, stop), is_special in zip(ids, offsets, specials):
            if is_special:
                tokens.append({"id": token, "text": tokenizer.convert_ids_to_tokens(token), "special": True,
                               "start": None, "stop": None})
            else:
                tokens.append({"id": token, "text": text[start:stop], "special": False,
                               "start": to_bytes(start), "stop": to_bytes(stop)})
        answer.append(tokens)
    return answer


def _byte_offsets(text: str) -> Any:
    """Character offsets of `text` → byte offsets of its UTF-8 encoding (TEI's `start` and `stop`)."""
    if text.isascii():
        return lambda i: i
    ends = np.cumsum([0] + [len(c.encode("utf-8", "replace")) for c in text])
    return lambda i: int(ends[i])


async def handle_decode(request: Any, engine: Engine) -> Any:
    """`{"ids": [int] | [[int]], "skip_special_tokens": true}` → `[str, ...]`, one text per sequence of ids."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    batch = _ids(body.get("ids"), engine.config.max_client_batch_size, engine.tokenizer.vocab_size)
    skip = _flag(body, "skip_special_tokens", True)
    decode = engine.tokenizer.decode
    if sum(len(ids) for ids in batch) > LARGE_REQUEST // 8:
        from starlette.concurrency import run_in_threadpool

        return json_response(await run_in_threadpool(lambda: [decode(ids, skip) for ids in batch]))
    return json_response([decode(ids, skip) for ids in batch])
