"""Scoring sentence embeddings on a dev file: retrieval for pairs and triplets, rank correlation for scored pairs.

Retrieval (sentence-transformers' `InformationRetrievalEvaluator` measures, cosine similarity): the queries are the
distinct anchors, the corpus the distinct positives and hard negatives of the file; a query's relevant documents are
the positives it is paired with. Each query ranks the whole corpus: MRR@10 (1 / rank of the first relevant document
in the top 10, else 0), NDCG@10 (binary relevance) and recall@1/5/10 (the share of its relevant documents in the
top k), averaged over queries. Scored pairs: Spearman (the main metric) and Pearson correlation between the cosine
of each pair and its score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..finetune.metrics import pearson, spearman
from .data import PairData
from .losses import cosine_matrix

RECALL_AT = (1, 5, 10)
TOP = 10
QUERY_CHUNK = 1024  # queries scored against the corpus at a time (bounds the [queries, corpus] matrix)


@dataclass
class RetrievalSet:
    """Distinct query texts, distinct corpus texts, and each query's relevant corpus indices."""

    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]


def retrieval_set(data: PairData) -> RetrievalSet:
    """The retrieval set of a pair or triplet file (see the module docstring)."""
    corpus_index: dict[str, int] = {}
    for column in data.texts[1:]:
        for text in column:
            corpus_index.setdefault(text, len(corpus_index))
    query_index: dict[str, int] = {}
    relevant: list[set[int]] = []
    for anchor, positive in zip(data.texts[0], data.texts[1]):
        q = query_index.setdefault(anchor, len(query_index))
        if q == len(relevant):
            relevant.append(set())
        relevant[q].add(corpus_index[positive])
    return RetrievalSet(list(query_index), list(corpus_index), relevant)


def retrieval_metrics(queries: Tensor, corpus: Tensor, relevant: Sequence[set[int]]) -> dict[str, float]:
    """MRR@10, NDCG@10 and recall@k of query embeddings [Q, H] ranking corpus embeddings [C, H] by cosine."""
    k = min(TOP, len(corpus))
    sums = {"mrr@10": 0.0, "ndcg@10": 0.0, **{f"recall@{r}": 0.0 for r in RECALL_AT}}
    for start in range(0, len(queries), QUERY_CHUNK):
        top = cosine_matrix(queries[start : start + QUERY_CHUNK], corpus).topk(k, dim=1).indices.tolist()  # [q, k]
        for ranked, wanted in zip(top, relevant[start : start + QUERY_CHUNK]):
            hits = [rank for rank, doc in enumerate(ranked, start=1) if doc in wanted]
            sums["mrr@10"] += 1.0 / hits[0] if hits else 0.0
            ideal = sum(1.0 / math.log2(r + 1) for r in range(1, min(len(wanted), TOP) + 1))
            sums["ndcg@10"] += sum(1.0 / math.log2(r + 1) for r in hits) / ideal
            for r in RECALL_AT:
                sums[f"recall@{r}"] += sum(1 for h in hits if h <= r) / len(wanted)
    return {name: total / len(queries) for name, total in sums.items()}


def similarity_metrics(a: Tensor, b: Tensor, scores: Sequence[float]) -> dict[str, float]:
    """Spearman and Pearson correlation between the cosine of each pair (rows of a and b, [n, H]) and its score."""
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).tolist()
    return {"spearman": spearman(cos, list(scores)), "pearson": pearson(cos, list(scores))}


def main_metric(data: PairData) -> str:
    """The metric that picks the best evaluation: MRR@10 for retrieval, Spearman for scored pairs."""
    return "spearman" if data.shape == "scored" else "mrr@10"
