"""Tests of `bertforge.tokenizer.encoding`: the `__call__` arguments resolved as in transformers, bad ones refused.

Truncation, padding, tensors, pairs, pre-split words and word ids, against transformers' BertTokenizerFast."""

from __future__ import annotations

import random

import pytest

from bertforge.core.errors import BertforgeError
from tests.tokenizer.tokenizer_helpers import TRUNCATIONS, assert_same, outcome, word_lists


# ---------------------------------------------------------------------------------------------- parity


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


# ---------------------------------------------------------------------------------------------- errors


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
