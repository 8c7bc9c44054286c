"""Scoring a model on an evaluation set: the three tasks of `bertforge evaluate` beyond fine-tuning's.

Each evaluator takes the model as functions (texts → vectors, pairs → scores), so that the command's pipelines and
a trainer's own encoder call the same code:

* `evaluate_sts`: both sides of the pairs embedded, then `metrics.similarity_metrics`.
* `evaluate_retrieval`: the queries embedded at once, the corpus streamed (in ascending id order) into blocks of
  `CORPUS_BLOCK` vectors merged into an exact running top-100 (`topk.TopK`); optionally the first `rerank_top` of
  each ranking rescored by a cross-encoder and put first, in its order; then `metrics.retrieval_metrics`.
* `evaluate_rerank`: every (query, candidate) pair scored, then `metrics.rerank_metrics`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import BertforgeError
from .data import RerankData, RetrievalData
from .metrics import RETRIEVAL_DEPTH, SIMILARITIES, rerank_metrics, retrieval_metrics, similarity_metrics
from .topk import TopK

if TYPE_CHECKING:
    from ..embeddings_train.data import PairData


CORPUS_BLOCK = 8192  # document vectors scored at a time (a sparse model's blocks: a 32nd of it, sparse COO matrices)
Embed = Callable[[list[str]], Tensor]
ScorePairs = Callable[[list[tuple[str, str]]], Sequence[float]]


def evaluate_sts(embed: Embed, data: PairData, similarity: str = "cosine") -> dict[str, float]:
    """Spearman and Pearson of the pairs' cosine (and of the model's `similarity` function, when another one)."""
    return similarity_metrics(embed(data.texts[0]), embed(data.texts[1]), data.scores or [], (similarity,))


def sparse_dot(queries: Tensor, documents: Tensor) -> Tensor:
    """Dot products [q, d] of dense query rows and a sparse block of document rows."""
    return torch.sparse.mm(documents, queries.T).T


def blocks(vectors: Iterable[np.ndarray], size: int, sparse: bool) -> Iterable[Tensor]:
    """Vectors (one per document, in order) gathered into float32 blocks of `size` rows; sparse (COO) ones with
    `sparse`."""
    block: list[np.ndarray] = []

    def done() -> Tensor:
        dense = torch.from_numpy(np.stack(block)).float()
        return dense.to_sparse() if sparse else dense

    for vector in vectors:
        block.append(vector)
        if len(block) == size:
            yield done()
            block = []
    if block:
        yield done()


def rankings(queries: Tensor, corpus: Iterable[Tensor], score: Callable[[Tensor, Tensor], Tensor],
             depth: int = RETRIEVAL_DEPTH) -> list[list[int]]:
    """Each query's `depth` best corpus positions, best first, from blocks of document vectors in corpus order."""
    best = TopK(queries, depth, score)
    for block in corpus:
        best.add(block)
    return best.ranked()


def evaluate_retrieval(embed_queries: Embed, embed_corpus: Callable[[list[str]], Iterable[np.ndarray]],
                       data: RetrievalData, *, similarity: str = "cosine", sparse: bool = False,
                       rerank: ScorePairs | None = None, rerank_top: int = 100) -> dict[str, Any]:
    """Retrieval metrics of a model on `data` (see the module docstring). `embed_corpus` yields the documents'
    vectors one by one, in order (a pipeline's stream); `similarity` names one of `metrics.SIMILARITIES` (a sparse
    model scores by the dot product). With `rerank`, the metrics are the reranked ranking's and the first stage's
    are kept as `first_stage_<metric>`."""
    if similarity not in SIMILARITIES:
        raise BertforgeError(f"unknown similarity {similarity!r}; choose one of {', '.join(SIMILARITIES)}")
    score = sparse_dot if sparse else SIMILARITIES[similarity]
    queries = embed_queries(data.queries).float()
    ranked = rankings(queries, blocks(embed_corpus(data.corpus), CORPUS_BLOCK // (32 if sparse else 1), sparse),
                      score, max(RETRIEVAL_DEPTH, rerank_top if rerank is not None else 0))
    ids = [[data.corpus_ids[p] for p in row] for row in ranked]
    metrics: dict[str, Any] = {"queries": len(data.queries), "documents": len(data.corpus)}
    first = retrieval_metrics(ids, data.relevant)
    if rerank is None:
        return {**first, **metrics}
    if rerank_top < 1:
        raise BertforgeError(f"rerank_top must be a positive integer, got {rerank_top}")
    pairs = [(query, data.corpus[p]) for query, row in zip(data.queries, ranked) for p in row[:rerank_top]]
    scores = iter(rerank(pairs))
    reranked = []
    for row in ranked:
        top = row[:rerank_top]
        new = [next(scores) for _ in top]
        order = sorted(range(len(top)), key=lambda i: (-new[i], data.corpus_ids[top[i]]))  # ties: the lower id
        reranked.append([data.corpus_ids[top[i]] for i in order] + [data.corpus_ids[p] for p in row[rerank_top:]])
    return {**retrieval_metrics(reranked, data.relevant), **{f"first_stage_{k}": v for k, v in first.items()},
            "reranked": rerank_top, **metrics}


def evaluate_rerank(score: ScorePairs, data: RerankData) -> dict[str, Any]:
    """MRR@10, NDCG@10 and MAP of a cross-encoder's scores of each query's candidates."""
    pairs = [(query, doc) for query, docs in zip(data.queries, data.candidates) for doc in docs]
    values = iter(score(pairs))
    scores = [[float(next(values)) for _ in docs] for docs in data.candidates]
    return {**rerank_metrics(scores, data.relevant), "queries": len(data.queries)}
