"""Encoding helpers of `Tokenizer`: its arguments resolved as `transformers` does, batches built and returned.

Nothing here depends on the tokenizer family: these functions take a `tokenizers.Tokenizer` backend and plain values.
"""

from __future__ import annotations

import functools
import re
import string
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import tokenizers
from tokenizers import normalizers, pre_tokenizers
from tokenizers.models import WordPiece

from bertforge.core.errors import BertforgeError

PADDING_STRATEGIES = ("longest", "max_length", "do_not_pad")
TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second", "do_not_truncate")

# What `transformers` does to decoded text when `clean_up_tokenization_spaces` is set.
_CLEAN_UP_REPLACEMENTS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


class Strategies(NamedTuple):
    """The truncation and padding of one call, as the backend takes them."""

    truncation: str  # one of TRUNCATION_STRATEGIES
    padding: str  # one of PADDING_STRATEGIES
    max_length: int | None


def resolve_strategies(
    truncation: bool | str | None, padding: bool | str, max_length: int | None, model_max_length: int
) -> Strategies:
    """The `__call__` arguments as strategies: `truncation=None` truncates exactly when `max_length` is given and
    `padding` is not, and a needed but missing `max_length` is `model_max_length`, as in `transformers`."""
    padding_strategy = _padding_strategy(padding)
    if truncation is None:
        truncation = max_length is not None and padding is False
    truncation_strategy = _truncation_strategy(truncation)
    if max_length is None and (padding_strategy == "max_length" or truncation_strategy != "do_not_truncate"):
        max_length = model_max_length
    return Strategies(truncation_strategy, padding_strategy, max_length)


def configure(backend: tokenizers.Tokenizer, strategies: Strategies, pad_id: int, pad_token: str) -> None:
    """Set the backend's truncation and padding (the caller holds the tokenizer's lock)."""
    if strategies.truncation == "do_not_truncate":
        backend.no_truncation()
    else:
        backend.enable_truncation(cast(int, strategies.max_length), stride=0, strategy=strategies.truncation, direction="right")
    if strategies.padding == "do_not_pad":
        backend.no_padding()
    else:
        backend.enable_padding(
            direction="right",
            pad_id=pad_id,
            pad_type_id=0,
            pad_token=pad_token,
            length=strategies.max_length if strategies.padding == "max_length" else None,
        )


NO_TRUNCATION_OR_PADDING = Strategies("do_not_truncate", "do_not_pad", None)


def batch_inputs(text: Any, text_pair: Any, is_split_into_words: bool) -> tuple[bool, list[Any]]:
    """Whether the input is a batch, and the inputs as the list `encode_batch` takes.

    Mirrors `transformers`: a single input with an empty `text_pair` ("" or []) is encoded without a pair.
    """
    if is_split_into_words:
        batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
    else:
        if not isinstance(text, (str, list, tuple)):
            raise BertforgeError(f"text must be a string or a list of strings, not {type(text).__name__}")
        batched = isinstance(text, (list, tuple))
    if not batched:
        return False, [(text, text_pair) if text_pair else text]
    if text_pair is None:
        return True, list(text)
    if isinstance(text_pair, str) or len(text_pair) != len(text):
        raise BertforgeError("for a batch, text_pair must be a list as long as text")
    return True, list(zip(text, text_pair))


def outputs(
    encodings: list[tokenizers.Encoding],
    *,
    batched: bool,
    return_tensors: str | None,
    return_offsets_mapping: bool,
    return_special_tokens_mask: bool,
    return_word_ids: bool,
) -> dict[str, Any]:
    """What `__call__` returns for `encodings`: lists per input (unwrapped for a single input) or tensors."""
    result: dict[str, Any] = {
        "input_ids": [e.ids for e in encodings],
        "token_type_ids": [e.type_ids for e in encodings],
        "attention_mask": [e.attention_mask for e in encodings],
    }
    if return_special_tokens_mask:
        result["special_tokens_mask"] = [e.special_tokens_mask for e in encodings]
    if return_offsets_mapping:
        result["offset_mapping"] = [e.offsets for e in encodings]
    if return_tensors is not None:
        result = {key: _to_tensor(key, value, return_tensors) for key, value in result.items()}
    if return_word_ids:
        result["word_ids"] = [e.word_ids for e in encodings]
    if not batched and return_tensors is None:
        result = {key: value[0] for key, value in result.items()}
    return result


def clean_up_tokenization(text: str) -> str:
    """Punctuation glued back on ("a ." -> "a."), as `transformers` does with `clean_up_tokenization_spaces`."""
    for spaced, glued in _CLEAN_UP_REPLACEMENTS:
        text = text.replace(spaced, glued)
    return text


# ---------------------------------------------------------------------- text the backend cannot take quickly

_SURROGATE = re.compile("[\ud800-\udfff]")
_T = TypeVar("_T")


def without_surrogates(value: Any) -> Any:
    """`value` (a string, or lists/tuples of them, nested) with every surrogate code point replaced by U+FFFD.

    Returns `value` itself when nothing had to change. Python strings can hold lone surrogates (json.loads makes
    one from "\\ud800", surrogateescape decoding from an undecodable byte); UTF-8, and so the backend, cannot.
    """
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value) if _SURROGATE.search(value) else value
    if isinstance(value, (list, tuple)):
        cleaned = [without_surrogates(item) for item in value]
        if all(new is old for new, old in zip(cleaned, value)):
            return value
        return cleaned if isinstance(value, list) else tuple(cleaned)
    return value


def retry_without_surrogates(encode: Callable[[Any], _T], value: Any) -> _T:
    """`encode(value)`; if the backend refuses it (TypeError) and `value` holds lone surrogates, `encode` of it
    without them (only then, to keep the common path fast)."""
    try:
        return encode(value)
    except TypeError:
        cleaned = without_surrogates(value)
        if cleaned is value:
            raise
        return encode(cleaned)


_ASCII_PUNCTUATION = frozenset(string.punctuation)


@functools.lru_cache(maxsize=8)
def _long_run_pattern(keep: int) -> re.Pattern[str]:
    """Runs of more than `keep` ASCII letters and digits."""
    return re.compile(f"[A-Za-z0-9]{{{keep + 1},}}")


def shorten_long_runs(backend: tokenizers.Tokenizer, texts: list[str]) -> list[str]:
    """`texts` with each run of more than M + 1 ASCII letters and digits cut to its first M + 1 (M: WordPiece's
    `max_input_chars_per_word`), when that cannot change the ids: such a run lies inside one word (only
    whitespace, punctuation and CJK characters split words; none is an ASCII letter or digit; the BERT
    normalizer maps these characters one to one) of more than M characters before and after the cut, which
    WordPiece turns into one [UNK] without looking at it. A million-character word then costs microseconds
    instead of about half a second of normalizing and pre-tokenizing, paid again every epoch.

    Only for the standard BERT pipeline, and only while every added token begins and ends with ASCII
    punctuation (so that none can match inside or across the edge of a run); otherwise `texts` as they are.
    """
    model = backend.model
    if not isinstance(model, WordPiece):
        return texts
    keep = model.max_input_chars_per_word + 1
    if not any(len(text) > keep for text in texts):
        return texts
    if not (
        isinstance(backend.normalizer, normalizers.BertNormalizer)
        and isinstance(backend.pre_tokenizer, pre_tokenizers.BertPreTokenizer)
        and all(
            token.content and token.content[0] in _ASCII_PUNCTUATION and token.content[-1] in _ASCII_PUNCTUATION
            for token in backend.get_added_tokens_decoder().values()
        )
    ):
        return texts
    pattern = _long_run_pattern(keep)
    return [pattern.sub(lambda run: run.group()[:keep], text) if len(text) > keep else text for text in texts]


# ---------------------------------------------------------------------- argument checks


def _padding_strategy(padding: bool | str) -> str:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    if padding not in PADDING_STRATEGIES:
        raise BertforgeError(f"padding={padding!r}: expected True, False or one of {', '.join(PADDING_STRATEGIES)}")
    return padding


def _truncation_strategy(truncation: bool | str) -> str:
    if truncation is True:
        return "longest_first"
    if truncation is False:
        return "do_not_truncate"
    if truncation not in TRUNCATION_STRATEGIES:
        raise BertforgeError(
            f"truncation={truncation!r}: expected True, False or one of {', '.join(TRUNCATION_STRATEGIES)}"
        )
    return truncation


def _to_tensor(key: str, rows: list[list[Any]], kind: str) -> Any:
    """`rows` as an int64 torch tensor ("pt") or numpy array ("np")."""
    if kind not in ("pt", "np"):
        raise BertforgeError(f"return_tensors={kind!r}: expected None, 'pt' or 'np'")
    if len({len(row) for row in rows}) > 1:
        raise BertforgeError(f"cannot make a tensor of {key}: the sequences differ in length (use padding=True)")
    array = np.array(rows, dtype=np.int64)
    if kind == "np":
        return array
    import torch  # only needed here; keeps `import bertforge.tokenizer` light

    return torch.from_numpy(array)
