"""Reading a request: its body as a JSON object within the size limit, and the checks of its fields (each wrong
one a 4xx `ApiError` naming it)."""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError, batch_too_large, empty, invalid


async def read_json(request: Any, limit: int, large: int) -> dict[str, Any]:
    """The request's body as a JSON object; 413 past `limit` bytes (TEI's --payload-limit), 400 if it is not JSON,
    422 if not an object. A body of more than `large` bytes is parsed in a thread (however it was sent: chunked
    bodies declare no size)."""
    too_large = ApiError(413, f"the body is larger than {limit} bytes, the most this server takes (--payload-limit); "
                              "send fewer or shorter inputs per request", "Validation")
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large
    if len(body) > large:
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(_parse, body)
    return _parse(body)


def _parse(body: bytes | bytearray) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the body is not valid JSON ({str(err)[:200]})") from None
    if not isinstance(data, dict):
        raise invalid(f"the body must be a JSON object, got {_json_type(data)}")
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
        raise invalid(f'"{name}" must be true or false, got {_json_type(value)}')
    return value


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value)


def _inputs(value: Any, name: str, limit: int, ids: bool = True) -> tuple[list[Any], bool]:
    """TEI's `Input`: a string or an array of token ids (one input), or an array of those → (inputs, whether it was
    one): each input a string or (with `ids`) a list of token ids. An empty array is TEI's 400 Empty, more than
    `limit` inputs its 422."""
    what = "a string, an array of token ids, or an array of those" if ids else "a string or an array of strings"
    if isinstance(value, str):
        return [value], True
    if value is None:
        raise invalid(f'missing "{name}": {what}')
    if not isinstance(value, list):
        raise invalid(f'"{name}" must be {what}, got {_json_type(value)}')
    if not value:
        raise empty(f"`{name}` cannot be empty")
    if ids and _is_ids(value):
        return [value], True
    if len(value) > limit:
        raise batch_too_large(len(value), limit)
    for i, item in enumerate(value):
        if not isinstance(item, str) and not (ids and _is_ids(item)):
            raise invalid(f'"{name}"[{i}] must be {"a string or an array of token ids" if ids else "a string"}, '
                          f"got {_json_type(item)}")
        if not isinstance(item, str) and not item:
            raise empty(f"`{name}`[{i}] cannot be empty")
    return value, False


def _texts(value: Any, name: str, limit: int) -> tuple[list[str], bool]:
    """A string or a non-empty array of strings → (texts, whether it was one string)."""
    return _inputs(value, name, limit, ids=False)


def _predict_items(value: Any, limit: int) -> tuple[list[Any], bool]:
    """"inputs" of /predict, TEI's `PredictInput`: a string, a pair `[text, text_pair]` (one input), or a batch
    of `[text]` and `[text, text_pair]` arrays → (items: a text or a (text, text_pair) tuple, whether it was one)."""
    shape = 'a string, a pair ["text", "text_pair"], or a batch [["text"], ["text", "text_pair"], ...]'
    if isinstance(value, str):
        return [value], True
    if value is None:
        raise invalid(f'missing "inputs": {shape}')
    if not isinstance(value, list):
        raise invalid(f'"inputs" must be {shape}, got {_json_type(value)}')
    if not value:
        raise empty("`inputs` cannot be empty")
    if isinstance(value[0], str):  # one input: a text, or a pair
        if len(value) > 2 or not all(isinstance(x, str) for x in value):
            raise invalid(f'"inputs" must be {shape}: an array of strings is one input of one or two texts, '
                          f"got {len(value)} elements")
        return [value[0] if len(value) == 1 else (value[0], value[1])], True
    if len(value) > limit:
        raise batch_too_large(len(value), limit)
    items: list[Any] = []
    for i, item in enumerate(value):
        if not isinstance(item, list) or not 1 <= len(item) <= 2 or not all(isinstance(x, str) for x in item):
            raise invalid(f'"inputs"[{i}] must be ["text"] or ["text", "text_pair"] (one or two strings)')
        items.append(item[0] if len(item) == 1 else (item[0], item[1]))
    return items, False


def _left(body: dict[str, Any]) -> bool:
    """Whether "truncation_direction" asks to cut an input's start (TEI's "Left") rather than its end ("Right",
    the default)."""
    value = body.get("truncation_direction")
    if value is None or value in ("Right", "right"):
        return False
    if value in ("Left", "left"):
        return True
    raise invalid(f'"truncation_direction" must be "Left" or "Right", got {value!r:.40}')


def _dimensions(body: dict[str, Any], size: int) -> int | None:
    """"dimensions" of /embed and /v1/embeddings: keep each vector's first N numbers (a Matryoshka model's smaller
    embedding; normalised after the cut when normalised), an integer in 1..`size`; None: the whole vector."""
    value = body.get("dimensions")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= size):
        raise invalid(f'"dimensions" must be an integer in 1..{size}, got {value!r:.40}')
    return value


def _prompt_name(body: dict[str, Any]) -> str | None:
    """TEI's "prompt_name": the sentence-transformers prompt put before each input (`Engine.prompt`)."""
    value = body.get("prompt_name")
    if value is not None and not isinstance(value, str):
        raise invalid(f'"prompt_name" must be a string, got {_json_type(value)}')
    return value


def _ids(value: Any, limit: int, vocab_size: int) -> list[list[int]]:
    """"ids" of /decode: an array of token ids, or an array of such arrays (at most `limit`)."""
    if not isinstance(value, list):
        raise invalid(f'"ids" must be an array of token ids or an array of such arrays, got {_json_type(value)}')
    if not value:
        raise empty("`ids` cannot be empty")
    batch = [value] if not isinstance(value[0], list) else value
    if len(batch) > limit:
        raise batch_too_large(len(batch), limit)
    for i, ids in enumerate(batch):
        if not isinstance(ids, list):
            raise invalid(f'"ids"[{i}] must be an array of token ids, got {_json_type(ids)}')
        for j, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                where = f"[{j}]" if batch is not value else f"[{i}][{j}]"
                raise invalid(f'"ids"{where} must be a token id in 0..{vocab_size - 1}, got {token!r:.40}')
    return batch
