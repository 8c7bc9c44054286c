"""Tests of `bertforge.pipelines.base`: token-budget batches sorted by length, and features computed apart."""

from __future__ import annotations

import numpy as np
import pytest

import bertforge
from bertforge import BertforgeError
from bertforge.pipelines.base import make_batches
from tests.pipelines.pipelines_helpers import SENTENCES


def test_make_batches_sorts_and_respects_budget():
    lengths = [5, 30, 2, 30, 12, 7, 100]
    batches = make_batches(lengths, batch_tokens=40, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        sizes = [lengths[i] for i in b]
        assert sizes == sorted(sizes, reverse=True)
        assert len(b) <= 3 and (sum(sizes) <= 40 or len(b) == 1)


def test_run_features_equals_the_call(heads, embed):
    """The entry point for callers that tokenize ahead (the server): features in, the same results out."""
    tc = bertforge.pipeline("text-classification", model=heads["tc"], top_k=None)
    items = ["Hi!", ("a question", "and its context"), SENTENCES[0], ("", "")]
    features, truncated = tc.features(items)
    assert truncated == 0 and sorted(f.item for f in features) == [0, 1, 2, 3]
    assert tc.run_features(items, features) == tc(items)
    features, _ = embed.features(SENTENCES)
    np.testing.assert_allclose(np.stack(embed.run_features(SENTENCES, features)), embed(SENTENCES), rtol=0, atol=1e-6)
    with pytest.raises(BertforgeError, match="input 1 is a int"):
        embed.features(["fine", 3])
    with pytest.raises(BertforgeError, match="outside the 1 given"):
        embed.run_features(SENTENCES[:1], features[:2])
