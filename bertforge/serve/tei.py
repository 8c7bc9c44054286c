"""text-embeddings-inference's other routes: `/embed_all` (every token's vector), `/embed_sparse` (SPLADE),
`/similarity` (cosine of pooled embeddings), and the tokenizer's `/tokenize` and `/decode`. Bodies, answers and
error shapes are TEI's (`router/src/http/types.rs`); limits, truncation and batching are those of the other routes
(`handlers`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .engine import Engine
from .errors import backend, batch_too_large, empty, invalid
from .handlers import LARGE_REQUEST, _compute, _need, off_loop
from .requests import _flag, _ids, _inputs, _json_type, _left, _prompt_name, _texts, read_json
from .responses import _json_floats, finite_rows, json_bytes, json_response


async def handle_embed_all(request: Any, engine: Engine) -> Any:
    """Every token's last hidden state, special tokens included: `[[[float, ...], ...], ...]`, one array of
    token vectors per input (the feature-extraction pipeline's). The answer grows with the tokens, not the inputs:
    a request may hold at most `max_batch_tokens` of them, and tokens x hidden size at most --max-response-values
    numbers (422 past either); the JSON is written off the event loop."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    _need(engine, "embedding", "/embed_all")
    if engine.sparse:
        raise backend("`embed_all` is not available for SPLADE models")
    inputs, _ = _inputs(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    limit = min(engine.config.max_batch_tokens, engine.config.max_response_values // engine.hidden_size)
    results, _ = await _compute(engine, engine.kind("embed_all", body.get("adapter")), inputs, truncate,
                                left=_left(body), max_tokens=limit, prompt=engine.prompt(_prompt_name(body)))
    from starlette.responses import Response

    return Response(await off_loop(lambda: json_bytes([finite_rows(rows) for rows in results])),
                    media_type="application/json")


async def handle_embed_sparse(request: Any, engine: Engine) -> Any:
    return await embed_sparse(await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST), engine)


async def embed_sparse(body: dict[str, Any], engine: Engine) -> Any:
    """SPLADE vectors from the MLM head: `[[{"index": int, "value": float}, ...], ...]`, the non-zero entries of
    each input's vocabulary-sized vector, by index. Only a sparse model answers (a SPLADE model, or a masked-LM one
    served with --pooling splade; else TEI's 424); inputs x vocabulary at most --max-response-values (422), the JSON
    written off the event loop."""
    _need(engine, "sparse", "/embed_sparse")
    inputs, _ = _inputs(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    vocab, limit = engine.tokenizer.vocab_size, engine.config.max_response_values
    if len(inputs) * vocab > limit:
        raise invalid(f"{len(inputs)} inputs of {vocab} sparse values each may answer more than "
                      f"--max-response-values ({limit}); send at most {max(1, limit // vocab)} inputs per request")
    truncate = _flag(body, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, "embed_sparse", inputs, truncate, left=_left(body),
                                prompt=engine.prompt(_prompt_name(body)))
    return json_response_bytes(await off_loop(lambda: json_bytes([_sparse(row) for row in results])))


def _sparse(row: np.ndarray) -> list[dict[str, Any]]:
    indices = np.flatnonzero(row)
    values = _json_floats(finite_rows(row[indices][None]))[0]  # float32 as its shortest decimals
    return [{"index": int(i), "value": v} for i, v in zip(indices.tolist(), values.tolist())]


def json_response_bytes(body: bytes) -> Any:
    from starlette.responses import Response

    return Response(body, media_type="application/json")


async def handle_similarity(request: Any, engine: Engine) -> Any:
    return await similarity(await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST), engine)


async def similarity(body: dict[str, Any], engine: Engine) -> Any:
    """`{"inputs": {"source_sentence": str, "sentences": [str]}, "parameters": {"truncate", ...}}` → the cosine
    similarity of the source's pooled embedding with each sentence's: `[float, ...]`."""
    _need(engine, "embedding", "/similarity")
    inputs = body.get("inputs")
    if not isinstance(inputs, dict):
        raise invalid(f'"inputs" must be an object {{"source_sentence": str, "sentences": [str]}}, got '
                      f"{_json_type(inputs)}")
    source = inputs.get("source_sentence")
    if not isinstance(source, str):
        raise invalid(f'"inputs.source_sentence" must be a string, got {_json_type(source)}')
    sentences = inputs.get("sentences")
    if not isinstance(sentences, list):  # one string is not TEI's shape
        raise invalid(f'"inputs.sentences" must be an array of strings, got {_json_type(sentences)}')
    if not sentences:
        raise empty("`inputs.sentences` cannot be empty")
    limit = engine.config.max_client_batch_size
    if len(sentences) + 1 > limit:
        raise batch_too_large(len(sentences) + 1, limit)
    texts, _ = _texts(sentences, "inputs.sentences", limit)
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise invalid(f'"parameters" must be an object, got {_json_type(parameters)}')
    truncate = _flag(parameters, "truncate", engine.config.auto_truncate)
    results, _ = await _compute(engine, "embed", [source, *texts], truncate, left=_left(parameters),
                                prompt=engine.prompt(_prompt_name(parameters)))
    rows = np.stack(results).astype(np.float64)
    norms = np.maximum(np.linalg.norm(rows, axis=1), 1e-12)
    cosines = rows[1:] @ rows[0] / (norms[1:] * norms[0])
    return json_response(cosines.tolist())


async def handle_tokenize(request: Any, engine: Engine) -> Any:
    """`{"inputs": str | [str], "add_special_tokens": true, "prompt_name"}` → one list of tokens per input, each
    `{"id", "text", "special", "start", "stop"}`: start and stop are byte offsets into the UTF-8 input (null for
    special tokens), as TEI answers. Bounded: inputs past `max_input_chars` and requests of more than
    --max-batch-tokens tokens get 422 (nothing is truncated); the answer is built off the event loop."""
    body = await read_json(request, engine.config.max_body_bytes, LARGE_REQUEST)
    texts, _ = _texts(body.get("inputs"), "inputs", engine.config.max_client_batch_size)
    special = _flag(body, "add_special_tokens", True)
    prompt = engine.prompt(_prompt_name(body))
    texts = engine.bound([prompt + text for text in texts], truncate=False, hint="shorten it")
    return json_response_bytes(await off_loop(lambda: json_bytes(_tokens(engine, texts, special))))


def _tokens(engine: Engine, texts: list[str], special: bool) -> list[list[dict[str, Any]]]:
    tokenizer = engine.tokenizer
    enc = tokenizer(texts, add_special_tokens=special, return_offsets_mapping=True, return_special_tokens_mask=True)
    total, limit = sum(len(ids) for ids in enc["input_ids"]), engine.config.max_batch_tokens
    if total > limit:
        raise invalid(f"the inputs hold {total} tokens, more than /tokenize answers for in one request ({limit}, "
                      "--max-batch-tokens); send fewer or shorter inputs")
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
    total, limit = sum(len(ids) for ids in batch), engine.config.max_batch_tokens
    if total > limit:
        raise invalid(f"the ids hold {total} tokens, more than /decode answers for in one request ({limit}, "
                      "--max-batch-tokens)")
    return json_response_bytes(await off_loop(lambda: json_bytes([decode(ids, skip) for ids in batch])))
