"""Reading a request: its body as a JSON object within the size limit, and the checks of its fields (each wrong
one a 4xx `ApiError` naming it)."""

from __future__ import annotations

import json
from typing import Any

from .errors import ApiError


async def read_json(request: Any, limit: int, large: int) -> dict[str, Any]:
    """The request's body as a JSON object; 413 past `limit` bytes, 400 if it is not JSON, 422 if not an object.
    A body of more than `large` bytes is parsed in a thread (however it was sent: chunked bodies declare no size)."""
    too_large = ApiError(413, f"the body is larger than {limit} bytes, the most this server takes; send fewer or "
                              "shorter inputs per request", "Payload")
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
    _check_count(name, len(value), limit)
    for i, text in enumerate(value):
        if not isinstance(text, str):
            raise ApiError(422, f'"{name}"[{i}] must be a string, got {_json_type(text)}')
    return value, False


def _check_count(name: str, count: int, limit: int, what: str = "inputs") -> None:
    """A request's batch beyond the server's cap (--max-client-batch-size) is refused (413), naming both counts."""
    if count > limit:
        raise ApiError(413, f'"{name}" has {count} {what}, more than this server takes in one request ({limit}); '
                            "split it", "Payload")


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
    _check_count("inputs", len(value), limit)
    items: list[Any] = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            items.append(item)
        elif isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            items.append((item[0], item[1]))
        else:
            raise ApiError(422, f'"inputs"[{i}] must be a string or a [text, text_pair] array of two strings')
    return items, False


def _left(body: dict[str, Any]) -> bool:
    """Whether "truncation_direction" asks to cut an input's start (TEI's "Left") rather than its end ("Right",
    the default)."""
    value = body.get("truncation_direction")
    if value is None or value in ("Right", "right"):
        return False
    if value in ("Left", "left"):
        return True
    raise ApiError(422, f'"truncation_direction" must be "Left" or "Right", got {value!r:.40}')


def _dimensions(body: dict[str, Any], size: int) -> int | None:
    """"dimensions" of /embed and /v1/embeddings: keep each vector's first N numbers (a Matryoshka model's smaller
    embedding; normalised after the cut when normalised), an integer in 1..`size`; None: the whole vector."""
    value = body.get("dimensions")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= size):
        raise ApiError(422, f'"dimensions" must be an integer in 1..{size}, got {value!r:.40}')
    return value


def _no_prompt(body: dict[str, Any]) -> None:
    """TEI's "prompt_name" picks a sentence-transformers prompt; this server has none to pick."""
    if body.get("prompt_name") is not None:
        raise ApiError(422, '"prompt_name" is not supported: this server prepends no prompts; put it in the text')


def _ids(value: Any, limit: int, vocab_size: int) -> list[list[int]]:
    """"ids" of /decode: an array of token ids, or an array of such arrays (at most `limit`)."""
    if not isinstance(value, list):
        raise ApiError(422, f'"ids" must be an array of token ids or an array of such arrays, got {_json_type(value)}')
    batch = [value] if not value or not isinstance(value[0], list) else value
    _check_count("ids", len(batch), limit, "sequences")
    for i, ids in enumerate(batch):
        if not isinstance(ids, list):
            raise ApiError(422, f'"ids"[{i}] must be an array of token ids, got {_json_type(ids)}')
        for j, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
                where = f"[{j}]" if batch is not value else f"[{i}][{j}]"
                raise ApiError(422, f'"ids"{where} must be a token id in 0..{vocab_size - 1}, got {token!r:.40}')
    return batch
