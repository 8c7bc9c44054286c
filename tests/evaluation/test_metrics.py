"""Tests of `bertforge.evaluation.metrics` against sentence-transformers' own metric code on the same inputs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bertforge.evaluation.metrics import (
    RETRIEVAL_AT, SIMILARITIES, pairwise_similarity, rerank_metrics, retrieval_metrics, similarity_metrics,
)

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")
scipy_stats = pytest.importorskip("scipy.stats")
util = st.util


def st_retrieval_evaluator(relevant: dict[str, set[str]]):
    from sentence_transformers.sentence_transformer.evaluation import InformationRetrievalEvaluator

    return InformationRetrievalEvaluator(
        queries={q: q for q in relevant}, corpus={"d0": "x"}, relevant_docs=relevant,
        mrr_at_k=list(RETRIEVAL_AT["mrr"]), ndcg_at_k=list(RETRIEVAL_AT["ndcg"]), accuracy_at_k=[1],
        precision_recall_at_k=sorted({*RETRIEVAL_AT["recall"], *RETRIEVAL_AT["precision"]}),
        map_at_k=list(RETRIEVAL_AT["map"]))


def test_retrieval_metrics_equal_information_retrieval_evaluator():
    rng = random.Random(0)
    docs = [f"d{i}" for i in range(300)]
    relevant = {f"q{q}": set(rng.sample(docs[:60], rng.randint(1, 12))) | ({"absent"} if q % 7 == 0 else set())
                for q in range(40)}
    ranked = {q: rng.sample(docs[:150], 150) for q in relevant}  # relevant ones land anywhere, some beyond 100
    results = [[{"corpus_id": d, "score": 1.0 - rank / 1000} for rank, d in enumerate(ranked[q])] for q in relevant]
    expected = st_retrieval_evaluator(relevant).compute_metrics(results)
    ours = retrieval_metrics([ranked[q] for q in relevant], list(relevant.values()))
    assert sorted(ours) == ["map@100", "mrr@10", "ndcg@10", "precision@1", "precision@10", "recall@1", "recall@10",
                            "recall@100"]
    for name, value in ours.items():
        metric, k = name.split("@")
        assert value == pytest.approx(float(expected[f"{metric}@k"][int(k)]), abs=1e-12), name
    assert 0 < ours["ndcg@10"] < 1 and 0 < ours["map@100"] < 1


def test_a_short_ranking_and_a_perfect_one():
    perfect = retrieval_metrics([["a", "b", "c"]], [{"a", "b"}])
    assert perfect["ndcg@10"] == perfect["mrr@10"] == perfect["map@100"] == perfect["recall@10"] == 1.0
    assert perfect["precision@10"] == pytest.approx(0.2)  # hits over k, as the evaluator counts a short ranking
    assert retrieval_metrics([["c", "a"]], [{"a"}])["mrr@10"] == 0.5
    with pytest.raises(ValueError, match="2 rankings for 1 queries"):
        retrieval_metrics([["a"], ["b"]], [{"a"}])


def test_rerank_metrics_equal_the_cross_encoder_reranking_evaluator():
    from sentence_transformers.cross_encoder.evaluation import CrossEncoderRerankingEvaluator

    evaluator = CrossEncoderRerankingEvaluator(samples=[], at_k=10)
    rng = np.random.default_rng(0)
    scores, relevant, positives = [], [], []
    for q in range(30):
        n = int(rng.integers(2, 25))
        row = rng.normal(size=n).round(1 if q % 3 == 0 else 6)  # every third query with tied scores
        flags = list(rng.random(n) < 0.3)
        flags[0] = q % 5 != 0 or flags[0]  # a few queries with no relevant candidate
        scores.append(row.tolist())
        relevant.append([bool(f) for f in flags])
        positives.append(sum(flags) + (q % 4 == 0))  # some relevant documents not among the candidates
    ours = rerank_metrics(scores, relevant, positives)
    theirs = [evaluator.compute_metrics([int(f) for f in flags], np.array(row), p)
              for row, flags, p in zip(scores, relevant, positives)]
    untied = [i for i in range(30) if i % 3]  # MRR of tied scores depends on argsort's order; the rest does not
    mean = np.mean(theirs, axis=0)
    assert ours["ndcg@10"] == pytest.approx(mean[1], abs=1e-12)
    assert ours["map"] == pytest.approx(mean[2], abs=1e-12)
    ours_untied = rerank_metrics([scores[i] for i in untied], [relevant[i] for i in untied],
                                 [positives[i] for i in untied])
    assert ours_untied["mrr@10"] == pytest.approx(np.mean([theirs[i][0] for i in untied]), abs=1e-12)


@pytest.mark.parametrize("name", list(SIMILARITIES))
def test_similarity_functions_equal_sentence_transformers(name):
    torch.manual_seed(0)
    a, b = torch.randn(7, 16), torch.randn(5, 16)
    matrix = {"cosine": util.cos_sim, "dot": util.dot_score, "euclidean": util.euclidean_sim,
              "manhattan": util.manhattan_sim}[name]
    torch.testing.assert_close(SIMILARITIES[name](a, b), matrix(a, b), rtol=0, atol=1e-5)
    pairwise = {"cosine": util.pairwise_cos_sim, "dot": util.pairwise_dot_score,
                "euclidean": util.pairwise_euclidean_sim, "manhattan": util.pairwise_manhattan_sim}[name]
    torch.testing.assert_close(pairwise_similarity(name, a[:5], b), pairwise(a[:5], b), rtol=0, atol=1e-5)


def test_similarity_metrics_are_scipys_correlations():
    torch.manual_seed(1)
    a, b = torch.randn(50, 16), torch.randn(50, 16)
    gold = (util.pairwise_cos_sim(a, b) + 0.3 * torch.randn(50)).tolist()
    metrics = similarity_metrics(a, b, gold, ("dot",))
    assert set(metrics) == {"spearman", "pearson", "spearman_dot", "pearson_dot"}
    cos = util.pairwise_cos_sim(a, b).numpy()
    dot = util.pairwise_dot_score(a, b).numpy()
    assert metrics["spearman"] == pytest.approx(scipy_stats.spearmanr(gold, cos)[0], abs=1e-9)
    assert metrics["pearson"] == pytest.approx(scipy_stats.pearsonr(gold, cos)[0], abs=1e-9)
    assert metrics["spearman_dot"] == pytest.approx(scipy_stats.spearmanr(gold, dot)[0], abs=1e-9)
    assert set(similarity_metrics(a, b, gold)) == {"spearman", "pearson"}
