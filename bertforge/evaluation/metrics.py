"""The numbers of embedding, retrieval and reranking evaluation, defined as sentence-transformers' evaluators compute
them (`tests/evaluation/test_metrics.py` checks each against the evaluator on the same inputs).

* Similarity of pairs (`EmbeddingSimilarityEvaluator`): Pearson and Spearman correlation between each pair's
  similarity and its gold score, for the similarity functions `SIMILARITIES` names.
* Retrieval (`InformationRetrievalEvaluator`): from each query's ranked document ids (best first, ties broken by
  ascending id) and its relevant ids: NDCG@10 (binary relevance), MRR@10, MAP@100 (the precisions at the relevant
  hits over min(100, relevant)), recall@k (the share of the relevant documents in the top k) and precision@k (hits
  in the top k over k), each averaged over the queries.
* Reranking (`CrossEncoderRerankingEvaluator`): from each query's candidates, their scores and relevance: MRR@10,
  NDCG@10 (tied scores share their discounts, as scikit-learn's `dcg_score`) and MAP (average precision, tied scores
  one threshold, as `average_precision_score`), averaged over the queries.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence, Set

import torch
from torch import Tensor

from ..finetune.metrics import pearson, spearman

# ------------------------------------------------------------------------------------------------------ similarity


def _cosine(a: Tensor, b: Tensor) -> Tensor:
    return torch.nn.functional.normalize(a, dim=-1) @ torch.nn.functional.normalize(b, dim=-1).T


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return a @ b.T


def _euclidean(a: Tensor, b: Tensor) -> Tensor:
    return -torch.cdist(a, b)


def _manhattan(a: Tensor, b: Tensor) -> Tensor:
    return -torch.cdist(a, b, p=1)


#: sentence-transformers' similarity functions (its `similarity_fn_name`): every query row [Q, H] against every
#: document row [D, H] → [Q, D], higher is more similar (the distances negated).
SIMILARITIES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "cosine": _cosine, "dot": _dot, "euclidean": _euclidean, "manhattan": _manhattan}


def pairwise_similarity(name: str, a: Tensor, b: Tensor) -> Tensor:
    """The similarity of each row of `a` with the same row of `b` ([n, H] each → [n])."""
    if name == "cosine":
        a, b = torch.nn.functional.normalize(a, dim=-1), torch.nn.functional.normalize(b, dim=-1)
    if name in ("cosine", "dot"):
        return (a * b).sum(-1)
    if name == "euclidean":
        return -((a - b) ** 2).sum(-1).sqrt()
    return -(a - b).abs().sum(-1)


def similarity_metrics(a: Tensor, b: Tensor, scores: Sequence[float], functions: Sequence[str] = ("cosine",)
                       ) -> dict[str, float]:
    """`spearman` and `pearson` of the cosine of each pair (rows of `a` and `b`) against its score; for each other
    function of `functions` (dot, euclidean, manhattan) also `spearman_<name>` and `pearson_<name>`."""
    metrics: dict[str, float] = {}
    for name in dict.fromkeys(("cosine", *functions)):
        values = pairwise_similarity(name, a.float(), b.float()).tolist()
        suffix = "" if name == "cosine" else f"_{name}"
        metrics[f"spearman{suffix}"] = spearman(values, list(scores))
        metrics[f"pearson{suffix}"] = pearson(values, list(scores))
    return metrics


# ------------------------------------------------------------------------------------------------------ retrieval

#: The cut-offs of each retrieval metric.
RETRIEVAL_AT = {"ndcg": (10,), "mrr": (10,), "map": (100,), "recall": (1, 10, 100), "precision": (1, 10)}
#: How many documents a query's ranking needs: the largest cut-off.
RETRIEVAL_DEPTH = max(k for ks in RETRIEVAL_AT.values() for k in ks)


def _dcg(hits: Sequence[int]) -> float:
    """Discounted gain of binary hits at 1-based ranks."""
    return sum(1.0 / math.log2(rank + 1) for rank in hits)


def retrieval_metrics(ranked: Sequence[Sequence[str]], relevant: Sequence[Set[str]]) -> dict[str, float]:
    """NDCG@10, MRR@10, MAP@100, recall@1/10/100 and precision@1/10 of rankings (each query's document ids, best
    first) against each query's non-empty set of relevant ids, averaged over the queries (see the module)."""
    if len(ranked) != len(relevant):
        raise ValueError(f"{len(ranked)} rankings for {len(relevant)} queries")
    sums = {f"{name}@{k}": 0.0 for name, ks in RETRIEVAL_AT.items() for k in ks}
    for ids, wanted in zip(ranked, relevant):
        hits = [rank for rank, doc in enumerate(ids[:RETRIEVAL_DEPTH], start=1) if doc in wanted]  # 1-based ranks
        for k in RETRIEVAL_AT["ndcg"]:
            ideal = _dcg(range(1, min(len(wanted), k) + 1))
            sums[f"ndcg@{k}"] += _dcg([h for h in hits if h <= k]) / ideal
        for k in RETRIEVAL_AT["mrr"]:
            sums[f"mrr@{k}"] += 1.0 / hits[0] if hits and hits[0] <= k else 0.0
        for k in RETRIEVAL_AT["map"]:
            within = [h for h in hits if h <= k]
            sums[f"map@{k}"] += sum((n + 1) / h for n, h in enumerate(within)) / min(k, len(wanted))
        for k in RETRIEVAL_AT["recall"]:
            sums[f"recall@{k}"] += sum(1 for h in hits if h <= k) / len(wanted)
        for k in RETRIEVAL_AT["precision"]:
            sums[f"precision@{k}"] += sum(1 for h in hits if h <= k) / k
    return {name: total / len(ranked) if ranked else 0.0 for name, total in sums.items()}


# ------------------------------------------------------------------------------------------------------ reranking

RERANK_AT = 10


def _tied_groups(scores: Sequence[float]) -> list[list[int]]:
    """The candidates' indices best first, grouped by equal score."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and scores[groups[-1][0]] == scores[i]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _rerank_query(scores: Sequence[float], relevant: Sequence[bool], positives: int) -> tuple[float, float, float]:
    """MRR@10, NDCG@10 and AP of one query's candidates (`positives`: its relevant documents, found or not)."""
    found = sum(relevant)
    if found == 0:
        return 0.0, 0.0, 0.0
    positives = max(positives, found)
    groups = _tied_groups(scores)
    flat = [i for group in groups for i in group]
    first = next(rank for rank, i in enumerate(flat, start=1) if relevant[i])
    mrr = 1.0 / first if first <= RERANK_AT else 0.0
    dcg, rank = 0.0, 0
    for group in groups:  # a tied group's gain spread evenly over the discounts of the ranks it spans
        discounts = sum(1.0 / math.log2(r + 1) for r in range(rank + 1, min(rank + len(group), RERANK_AT) + 1))
        dcg += discounts * sum(relevant[i] for i in group) / len(group)
        rank += len(group)
    ideal = _dcg(range(1, min(positives, RERANK_AT) + 1))
    ap, seen, hits = 0.0, 0, 0
    for group in groups:  # one threshold per distinct score
        seen += len(group)
        new = sum(relevant[i] for i in group)
        hits += new
        ap += new / found * hits / seen
    return mrr, dcg / ideal, ap * found / positives


def rerank_metrics(scores: Sequence[Sequence[float]], relevant: Sequence[Sequence[bool]],
                   positives: Sequence[int] | None = None) -> dict[str, float]:
    """`mrr@10`, `ndcg@10` and `map` of each query's candidate scores against their relevance (`positives`: each
    query's number of relevant documents, when some are not among its candidates), averaged over the queries."""
    totals = [0.0, 0.0, 0.0]
    for q, (row, flags) in enumerate(zip(scores, relevant)):
        values = _rerank_query(row, flags, sum(flags) if positives is None else positives[q])
        totals = [t + v for t, v in zip(totals, values)]
    n = max(len(scores), 1)
    return {f"mrr@{RERANK_AT}": totals[0] / n, f"ndcg@{RERANK_AT}": totals[1] / n, "map": totals[2] / n}
