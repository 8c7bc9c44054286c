"""Tests of `bertforge.data.decoding`: lines of invalid UTF-8 decoded with replacement, in linear time."""

import random
import time

from bertforge.data.decoding import decode_line


def reference_decode_line(raw):
    """decode_line as it was: re-slicing the rest of the line at each invalid sequence (quadratic in their number)."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    parts, replaced, rest = [], 0, raw
    while rest:
        try:
            parts.append(rest.decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            parts.append(rest[: err.start].decode("utf-8"))
            parts.append("\ufffd")
            replaced += err.end - err.start
            rest = rest[err.end :]
    return "".join(parts), replaced


def test_decode_line_matches_the_reference_on_random_bytes():
    rng = random.Random(0)
    pieces = [b"\xef\xbf\xbd", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xf0\x9f\x98\x80", b"\xe2\x82", b"\xc3", b"\xa9",
              b"a", b"\xff", b"\xc0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", "é€😀\ufeff".encode(), b"\n"]
    for _ in range(5000):
        raw = b"".join(rng.choice(pieces) if rng.random() < 0.7 else bytes([rng.randrange(256)])
                       for _ in range(rng.randint(0, 40)))
        assert decode_line(raw) == reference_decode_line(raw), raw


def test_decode_line_is_linear_in_invalid_bytes():
    raw = "café ".encode("latin-1") * 200_000  # 1 MB, 200,000 invalid bytes; the reference takes minutes
    started = time.perf_counter()
    text, replaced = decode_line(raw)
    assert time.perf_counter() - started < 5  # about 0.1 s
    assert replaced == 200_000 and text == "caf\ufffd " * 200_000
