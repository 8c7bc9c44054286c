"""Scoring sentence embeddings on `train-embeddings`' dev set, by `bertforge.evaluation`'s evaluators (the numbers
of `bertforge evaluate` and of sentence-transformers' evaluators).

* Pairs and triplets: retrieval. The queries are the distinct anchors, the corpus the distinct positives and hard
  negatives of the file; a query's relevant documents are the positives it is paired with. Main metric: MRR@10.
* A BEIR folder (corpus.jsonl, queries.jsonl, qrels/test.tsv): retrieval on it. Main metric: NDCG@10.
* Scored pairs: Spearman (the main metric) and Pearson correlation of each pair's cosine with its score.

Retrieval scores by cosine (a sparse encoder: by dot product, its queries' and documents' mean non-zero counts
reported too) and reports NDCG@10, MRR@10, MAP@100, recall@1/10/100 and precision@1/10. With prompts (`--prompts`),
the queries get the "query" prompt and the corpus the "document" one; scored pairs each column's (`column_prompts`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch import Tensor

from ..evaluation import evaluators
from ..evaluation.data import RetrievalData, read_beir
from .data import PairData, column_prompts, read_pairs, with_prompts

DevSet = PairData | RetrievalData


def retrieval_set(data: PairData) -> RetrievalData:
    """The retrieval set of a pair or triplet file (see the module docstring); ids are the texts' positions, written
    so that their order is the order of first appearance."""
    corpus_index: dict[str, int] = {}
    for column in data.texts[1:]:
        for text in column:
            corpus_index.setdefault(text, len(corpus_index))
    query_index: dict[str, int] = {}
    relevant: list[set[str]] = []
    for anchor, positive in zip(data.texts[0], data.texts[1]):
        q = query_index.setdefault(anchor, len(query_index))
        if q == len(relevant):
            relevant.append(set())
        relevant[q].add(f"{corpus_index[positive]:012d}")
    return RetrievalData([f"{i:012d}" for i in range(len(corpus_index))], list(corpus_index),
                         [f"{i:012d}" for i in range(len(query_index))], list(query_index), relevant)


def read_dev(data: Any) -> DevSet:
    """The dev set: a BEIR folder, or pairs, triplets or scored pairs (a file or rows in memory)."""
    if isinstance(data, (str, Path)) and Path(data).is_dir():
        return read_beir(data)
    return read_pairs(data)


def main_metric(data: DevSet) -> str:
    """The metric that picks the best evaluation: Spearman for scored pairs, MRR@10 for the retrieval set of pairs
    and triplets, NDCG@10 for a BEIR folder."""
    if isinstance(data, RetrievalData):
        return "ndcg@10"
    return "spearman" if data.shape == "scored" else "mrr@10"


def dev_evaluator(data: DevSet, embed: Callable[[list[str]], Tensor], sparse: bool = False,
                  prompts: dict[str, str] | None = None) -> Callable[[], dict[str, Any]]:
    """The function that scores the model (as `embed`: texts → float32 [n, H], or [n, V] sparse vectors with
    `sparse`) on the dev set, with `prompts` (see the module docstring)."""
    prompts = prompts or {}
    if isinstance(data, PairData) and data.shape == "scored":
        prompted = with_prompts(data, column_prompts(data, prompts, strict=False))
        return lambda: evaluators.evaluate_sts(embed, prompted, "dot" if sparse else "cosine")  # sparse: both
    lookup = data if isinstance(data, RetrievalData) else retrieval_set(data)
    counts: dict[str, list[float]] = {}

    def counted(texts: list[str], side: str) -> Tensor:
        vectors = embed(texts)
        if sparse:
            counts.setdefault(side, []).extend((vectors != 0).sum(-1).tolist())
        return vectors

    def queries(texts: list[str]) -> Tensor:
        return counted([prompts.get("query", "") + t for t in texts], "query")

    def documents(texts: list[str]) -> Iterator[np.ndarray]:  # a block of the corpus embedded at a time
        texts = [prompts.get("document", "") + t for t in texts]
        for start in range(0, len(texts), evaluators.CORPUS_BLOCK):
            yield from counted(texts[start:start + evaluators.CORPUS_BLOCK], "document").numpy()

    def retrieval() -> dict[str, Any]:  # the metrics only: the set's size is logged once, not in every row
        counts.clear()
        metrics = evaluators.evaluate_retrieval(queries, documents, lookup, sparse=sparse)
        nonzero = {f"{side}_nonzero": sum(c) / len(c) for side, c in counts.items() if c}
        return {**{k: v for k, v in metrics.items() if k not in ("queries", "documents")}, **nonzero}

    return retrieval
