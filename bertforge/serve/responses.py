"""Writing a response: JSON bodies, float32 vectors as the shortest decimals that read back as the same float32
(orjson, or `json` with 9 significant digits where orjson is missing)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def json_response(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
    from starlette.responses import Response

    body = json.dumps(data, allow_nan=False, separators=(",", ":"))  # ASCII: lone surrogates cannot break it
    return Response(body, status_code=status, media_type="application/json", headers=headers)


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
        orjson = None  # type: ignore[assignment]
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
