"""Tests of `bertforge.evaluation.topk`: the blocked top-k equals a full stable sort of the whole score matrix."""

from __future__ import annotations

import pytest
import torch

from bertforge.evaluation import topk
from bertforge.evaluation.metrics import SIMILARITIES
from bertforge.evaluation.topk import TopK


def full_ranking(queries, corpus, k, score):
    return score(queries, corpus).sort(dim=1, descending=True, stable=True).indices[:, :k].tolist()


@pytest.mark.parametrize("block", [1, 7, 64, 1000])
def test_blocks_of_any_size_give_the_exact_top_k(block, monkeypatch):
    monkeypatch.setattr(topk, "QUERY_BLOCK", 5)  # several query blocks too
    torch.manual_seed(0)
    queries, corpus = torch.randn(12, 16), torch.randn(230, 16)
    best = TopK(queries, 50, SIMILARITIES["cosine"])
    for start in range(0, len(corpus), block):
        best.add(corpus[start:start + block])
    assert best.ranked() == full_ranking(queries, corpus, 50, SIMILARITIES["cosine"])
    assert best.seen == 230


def test_ties_go_to_the_lower_position_inside_the_top_k_and_at_its_edge():
    torch.manual_seed(1)
    distinct = torch.randn(6, 8)
    corpus = distinct.repeat(9, 1)  # each vector 9 times: every score tied with 8 others
    queries = torch.randn(4, 8)
    best = TopK(queries, 20, SIMILARITIES["dot"])
    for start in range(0, len(corpus), 10):
        best.add(corpus[start:start + 10])
    assert best.ranked() == full_ranking(queries, corpus, 20, SIMILARITIES["dot"])
    first = best.ranked()[0]
    assert first[:9] == sorted(first[:9])  # the best vector's nine copies, in corpus order


def test_fewer_documents_than_k():
    best = TopK(torch.eye(3), 10, SIMILARITIES["dot"])
    best.add(torch.empty(0, 3))
    best.add(torch.eye(3)[[2, 0]])
    assert best.ranked() == [[1, 0], [0, 1], [0, 1]]
