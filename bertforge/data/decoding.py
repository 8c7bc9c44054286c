"""Corpus text that is not clean UTF-8: lines decoded with every invalid byte replaced by U+FFFD and counted, lone
surrogates from JSON escapes replaced, and the one warning that reports how many bytes were replaced."""

from __future__ import annotations

import codecs
import logging
import re
import threading

log = logging.getLogger("bertforge")

# A surrogate code point left in a str by json.loads (an escaped lone surrogate such as "\\ud800"; escaped pairs are
# joined into one character). Such text cannot be encoded as UTF-8, and the tokenizer backend rejects it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_surrogates(text: str) -> tuple[str, int]:
    """`text` with every surrogate code point replaced by U+FFFD, and how many were replaced."""
    return _SURROGATE.subn("\ufffd", text)


_REPLACED = threading.local()  # bytes replaced by the current decode_line call of this thread


def _replace_and_count(err: UnicodeError) -> tuple[str, int]:
    assert isinstance(err, UnicodeDecodeError)
    _REPLACED.count += err.end - err.start
    return "\ufffd", err.end


codecs.register_error("bertforge.replace_and_count", _replace_and_count)


def decode_line(raw: bytes) -> tuple[str, int]:
    """Decode one line of UTF-8; invalid bytes become U+FFFD. Returns (text, number of bytes replaced).

    Each invalid sequence the UTF-8 decoder reports becomes one U+FFFD (as ``errors="replace"`` does), in one pass:
    linear time however many invalid bytes a (long) line holds.
    """
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        pass
    _REPLACED.count = 0
    text = raw.decode("utf-8", "bertforge.replace_and_count")
    return text, _REPLACED.count


def warn_replaced(count: int, first: str | None = None, passes: int = 1) -> None:
    """Warn that `count` bytes of the corpus were not UTF-8 and were read as U+FFFD (nothing when 0); `passes`: how
    many times the corpus was read (each pass counts its bytes again)."""
    if count:
        where = f", the first at {first}" if first else ""
        if passes > 1:
            where += f" (counted on each of {passes} passes over the corpus)"
        many = count != 1
        log.warning("corpus: %s byte%s %s not UTF-8 and %s read as U+FFFD%s", f"{count:,}", "s" if many else "",
                    "were" if many else "was", "were" if many else "was", where)
