"""Tests of `bertforge.evaluation.evaluators` with the model as plain functions (the command's runs against
sentence-transformers' evaluators are in tests/commands/test_evaluate_embeddings.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertforge import BertforgeError
from bertforge.evaluation import evaluators
from bertforge.evaluation.data import RerankData, RetrievalData
from bertforge.evaluation.evaluators import blocks, evaluate_rerank, evaluate_retrieval

VECTORS = {"apple": [1.0, 0.0, 0.0], "pear": [0.9, 0.1, 0.0], "car": [0.0, 1.0, 0.0], "bus": [0.0, 0.9, 0.2],
           "sea": [0.0, 0.0, 1.0], "fruit": [1.0, 0.05, 0.0], "road": [0.0, 1.0, 0.1]}


def embed(texts):
    return torch.tensor([VECTORS[t] for t in texts])


def stream(texts):
    return iter(np.array(VECTORS[t], dtype=np.float32) for t in texts)


DATA = RetrievalData(corpus_ids=["a", "b", "c", "d", "e"], corpus=["apple", "bus", "car", "pear", "sea"],
                     query_ids=["q1", "q2"], queries=["fruit", "road"], relevant=[{"a", "d"}, {"b", "c"}])


def test_retrieval_in_blocks_of_one_document(monkeypatch):
    monkeypatch.setattr(evaluators, "CORPUS_BLOCK", 1)
    metrics = evaluate_retrieval(embed, stream, DATA)
    assert metrics["ndcg@10"] == metrics["mrr@10"] == metrics["recall@10"] == 1.0
    assert (metrics["queries"], metrics["documents"]) == (2, 5)
    assert metrics["precision@10"] == pytest.approx(0.2)


def test_a_reranker_reorders_only_the_top_k():
    def backwards(pairs):  # prefers the documents the first stage liked least
        return [-float(np.dot(VECTORS[q], VECTORS[d])) for q, d in pairs]

    metrics = evaluate_retrieval(embed, stream, DATA, rerank=backwards, rerank_top=3)
    assert metrics["first_stage_mrr@10"] == 1.0 and metrics["reranked"] == 3
    # q1's first stage: a, d, then c/b; the reranker puts the third first: one relevant document at rank 2
    assert metrics["mrr@10"] == pytest.approx(0.5)
    with pytest.raises(BertforgeError, match="rerank_top must be a positive integer"):
        evaluate_retrieval(embed, stream, DATA, rerank=backwards, rerank_top=0)
    with pytest.raises(BertforgeError, match="unknown similarity 'jaccard'"):
        evaluate_retrieval(embed, stream, DATA, similarity="jaccard")


def test_sparse_blocks_score_by_the_dot_product():
    rows = [np.array([0.0, 2.0, 0.0, 1.0], dtype=np.float32), np.array([3.0, 0.0, 0.0, 0.0], dtype=np.float32),
            np.array([0.0, 0.0, 0.5, 0.0], dtype=np.float32)]
    made = list(blocks(iter(rows), 2, sparse=True))
    assert [b.shape[0] for b in made] == [2, 1] and made[0].is_sparse
    queries = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    scores = torch.cat([evaluators.sparse_dot(queries, b) for b in made], dim=1)
    torch.testing.assert_close(scores, queries @ torch.from_numpy(np.stack(rows)).T)


def test_rerank_scores_each_query_with_its_candidates():
    data = RerankData(queries=["q", "r"], candidates=[["good", "bad", "worse"], ["fine", "poor"]],
                      relevant=[[True, False, False], [True, False]])
    quality = {"good": 0.2, "bad": 0.9, "worse": 0.1, "fine": 0.7, "poor": 0.3}
    metrics = evaluate_rerank(lambda pairs: [quality[d] for _, d in pairs], data)
    assert metrics["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["map"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["queries"] == 2
