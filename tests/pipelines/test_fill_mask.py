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
