"""Tests of `bertforge.pipelines.fill_mask`: [MASK] predictions against transformers' fill-mask pipeline."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import bertforge
from bertforge import BertforgeError

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")


def test_fill_mask_equals_transformers(mlm_dir):
    ours = bertforge.pipeline("fill-mask", model=mlm_dir, top_k=5)
    ref = transformers.pipeline("fill-mask", model=str(mlm_dir), device="cpu")
    texts = ["The capital of France is [MASK].", "I [MASK] to the [MASK] yesterday.", "[MASK]",
             "Short [MASK] and a much longer sentence about lobsters in the [MASK] sea, said the man."]
    got = ours(texts)
    for text, mine in zip(texts, got):
        theirs = ref(text, top_k=5)
        if isinstance(theirs[0], dict):
            mine, theirs = [mine], [theirs]
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            assert [p["token"] for p in a] == [p["token"] for p in b]
            assert [p["token_str"] for p in a] == [p["token_str"] for p in b]
            assert [p["sequence"] for p in a] == [p["sequence"] for p in b]
            assert np.allclose([p["score"] for p in a], [p["score"] for p in b], atol=1e-4, rtol=0)
    alone = ours(texts[0])  # alone, not in a batch: same predictions
    assert [p["token"] for p in alone] == [p["token"] for p in got[0]]
    assert np.allclose([p["score"] for p in alone], [p["score"] for p in got[0]], atol=1e-6)


def test_fill_mask_targets_and_long_input(mlm_dir, caplog):
    pipe = bertforge.pipeline("fill-mask", model=mlm_dir, targets=["paris", "london"], top_k=5)
    result = pipe("The capital of France is [MASK].")
    assert sorted(p["token_str"] for p in result) == ["london", "paris"]
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        long_result = pipe("The capital of France is [MASK]. " + "word " * 600)
    assert "truncated" in caplog.text and len(long_result) == 2
    with pytest.raises(BertforgeError, match=r"every \[MASK\] of input 0 lies beyond max_length=512"):
        pipe("word " * 600 + "[MASK]")


def test_fill_mask_errors(mlm_dir, minilm_dir):
    pipe = bertforge.pipeline("fill-mask", model=mlm_dir)
    with pytest.raises(BertforgeError, match=r"input 1 has no \[MASK\] token"):
        pipe(["a [MASK] b", "no mask here"])
    with pytest.raises(BertforgeError, match=r"has no MLM head \(cls\.predictions\.\*.*bertforge pretrain"):
        bertforge.pipeline("fill-mask", model=minilm_dir)
    with pytest.raises(BertforgeError, match="top_k must be"):
        bertforge.pipeline("fill-mask", model=mlm_dir, top_k=0)


def test_call_time_options_are_the_constructor_s_for_that_call_only(mlm_dir):
    """`fill(text, top_k=3)`, the transformers habit: the same as pipeline(..., top_k=3) and as transformers' own
    call, for that call only; transformers' options without a setting here are refused by name."""
    fill = bertforge.pipeline("fill-mask", model=mlm_dir)  # top_k 5
    ref = transformers.pipeline("fill-mask", model=str(mlm_dir), device="cpu")
    text = "The capital of France is [MASK]."
    three = fill(text, top_k=3)
    assert three == bertforge.pipeline("fill-mask", model=mlm_dir, top_k=3)(text)
    theirs = ref(text, top_k=3)
    assert [p["token"] for p in three] == [p["token"] for p in theirs]
    assert np.allclose([p["score"] for p in three], [p["score"] for p in theirs], atol=1e-4, rtol=0)
    assert len(fill(text)) == 5 and fill.top_k == 5  # the next call is unaffected
    targeted = fill(text, targets=["paris", "london"], top_k=1)
    assert targeted == bertforge.pipeline("fill-mask", model=mlm_dir, targets=["paris", "london"], top_k=1)(text)
    assert [p["token"] for p in targeted] == [p["token"] for p in ref(text, targets=["paris", "london"], top_k=1)]
    assert fill.target_ids is None and len(fill(text)) == 5
    assert fill(text, batch_size=1, truncation=True) == fill(text)
    with pytest.raises(BertforgeError, match=r"fill-mask: `tokenizer_kwargs` is not supported; .*max_length=N"):
        fill(text, tokenizer_kwargs={"truncation": True})
    with pytest.raises(BertforgeError, match=r"`truncation` is always on here: texts are cut at max_length"):
        fill(text, truncation=False)
    with pytest.raises(BertforgeError, match=r"fill-mask: unknown option `topk`; a call takes: .*top_k, targets"):
        fill(text, topk=3)
    with pytest.raises(BertforgeError, match="top_k must be a positive integer, got 0"):
        fill(text, top_k=0)


def test_calls_with_different_options_in_threads_keep_their_own(mlm_dir):
    """The server shares a pipeline among requests: one call's options never reach another's."""
    from concurrent.futures import ThreadPoolExecutor

    fill = bertforge.pipeline("fill-mask", model=mlm_dir)
    text = "I [MASK] to the sea."
    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(lambda k: len(fill(text, top_k=k)), [1, 2, 3, 4, 6, 7] * 3))
    assert sizes == [1, 2, 3, 4, 6, 7] * 3 and fill.top_k == 5
