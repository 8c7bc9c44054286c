"""Exact top-k retrieval over a corpus that arrives in blocks: memory bounded by a block, not by the corpus.

`TopK` keeps each query's k best documents so far, scores (float32) and corpus positions. Each block of document
vectors is scored against the queries (`QUERY_BLOCK` queries at a time: a [queries, block] matrix) and merged into
the running best. The order is total: a higher score first, then the lower corpus position (the caller numbers
the documents in ascending id order, so ties go to the lower id, as sentence-transformers' evaluator breaks them);
`torch.topk` alone breaks ties arbitrarily, so a row whose k-th score is tied is ordered by a stable sort instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

QUERY_BLOCK = 1024  # queries scored at a time against a block: a [1024, block] float32 matrix


def _best(scores: Tensor, positions: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Each row's k best (score, position) of `scores` [q, n], by score, ties to the lower column (the caller lays
    the columns out so that a lower column is a lower corpus position among equal scores)."""
    k = min(k, scores.shape[1])
    values, index = scores.topk(k, dim=1)
    tied = (scores >= values[:, -1:]).sum(dim=1) > k  # the k-th score also outside the top k: choose by sorting
    if tied.any():
        index[tied] = scores[tied].sort(dim=1, descending=True, stable=True).indices[:, :k]
    index = index.sort(dim=1).values  # ascending columns, then a stable sort by score: ties in column order
    order = scores.gather(1, index).sort(dim=1, descending=True, stable=True).indices
    index = index.gather(1, order)
    return scores.gather(1, index), positions.gather(1, index)


class TopK:
    """The `k` best documents of each of `queries` [Q, H] (or a sparse [Q, V]), scored by `score` (query rows,
    document rows → [q, d])."""

    def __init__(self, queries: Tensor, k: int, score: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.queries, self.k, self.score = queries, k, score
        n = queries.shape[0]
        self.values = torch.empty(n, 0)
        self.positions = torch.empty(n, 0, dtype=torch.long)
        self.seen = 0  # documents merged so far: the next block's first position

    def add(self, documents: Tensor) -> None:
        """Merge a block of document vectors [d, H], the next `d` positions of the corpus."""
        d = documents.shape[0]
        if d == 0:
            return
        columns = torch.arange(self.seen, self.seen + d)
        values, positions = [], []
        for start in range(0, self.queries.shape[0], QUERY_BLOCK):
            block = self.score(self.queries[start:start + QUERY_BLOCK], documents).float()  # [q, d]
            q = block.shape[0]
            # running best (lower positions) then this block (higher ones): position order within equal scores
            scores = torch.cat([self.values[start:start + q], block], dim=1)
            where = torch.cat([self.positions[start:start + q], columns.expand(q, d)], dim=1)
            v, p = _best(scores, where, self.k)
            values.append(v)
            positions.append(p)
        self.values, self.positions = torch.cat(values), torch.cat(positions)
        self.seen += d

    def ranked(self) -> list[list[int]]:
        """Each query's corpus positions, best first."""
        return self.positions.tolist()
