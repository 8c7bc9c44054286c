"""The losses a reranker (`finetune --task rerank`) trains with: `RERANK_LOSSES`, by `--loss` name, each as
sentence-transformers' `CrossEncoder` loss of that name defines it with its default settings (see `rerank`).

Each is a function of a batch's logits (one per (query, document) pair, row after row), the documents of each row
and the pairs' labels.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

MNRL_NEGATIVES, MNRL_SCALE = 4, 10.0  # sentence-transformers' defaults: in-batch negatives per query, logit scale
LAMBDA_MU, LAMBDA_SIGMA = 10.0, 1.0  # NDCG-Loss2++'s weight of the NDCG-Loss2 term; the logistic's slope


def _padded(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's logits and labels as a [rows, most documents] matrix, logits padded with -1e16 and labels with
    -inf (so that a padded document weighs nothing: sentence-transformers' convention)."""
    width = max(sizes)
    rows = torch.repeat_interleave(torch.arange(len(sizes), device=logits.device),
                                   torch.tensor(sizes, device=logits.device))
    columns = torch.cat([torch.arange(n, device=logits.device) for n in sizes])
    scores = torch.full((len(sizes), width), -1e16, device=logits.device, dtype=logits.dtype)
    targets = torch.full((len(sizes), width), -math.inf, device=logits.device, dtype=logits.dtype)
    scores[rows, columns] = logits
    targets[rows, columns] = labels.to(logits.dtype)
    return scores, targets


def bce_loss(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> Tensor:
    return F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype))


def mse_loss(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> Tensor:
    return F.mse_loss(logits, labels.to(logits.dtype))


def listnet_loss(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> Tensor:
    """ListNet (Cao et al., 2007): the cross-entropy of the logits' softmax against the labels' softmax, per row."""
    scores, targets = _padded(logits, sizes, labels)
    return F.cross_entropy(scores, targets.softmax(dim=1))


def lambda_loss(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> Tensor:
    """LambdaLoss (Wang et al., 2018) with the NDCG-Loss2++ weighting: over every pair of a row's documents whose
    labels differ, -log2 σ(σ·(s_i - s_j)) for the pair ranked i before j by the logits, weighted by μ·(NDCG-Loss2's
    |1/D(|i-j|) - 1/D(|i-j|+1)|·|G_i - G_j|) + LambdaRank's |1/D(i) - 1/D(j)|·|G_i - G_j|, with D(r) = log2(1 + r)
    and G the gain 2^label - 1 over the row's ideal DCG; the mean over those pairs."""
    scores, targets = _padded(logits, sizes, labels)
    width = scores.shape[1]
    sorted_scores, order = scores.sort(descending=True, dim=-1)
    ideal, _ = targets.sort(descending=True, dim=-1)
    by_prediction = torch.gather(targets, 1, order)  # [rows, width]: the labels in predicted order
    differences = by_prediction[:, :, None] - by_prediction[:, None, :]
    pairs = torch.isfinite(differences) & (differences > 0)  # real documents, i's label above j's
    by_prediction, ideal = by_prediction.clamp(min=0.0), ideal.clamp(min=0.0)
    ranks = torch.arange(1, width + 1, device=scores.device, dtype=scores.dtype)
    discount = torch.log2(1.0 + ranks)[None, :]  # [1, width]
    best = ((2.0 ** ideal - 1) / discount).sum(dim=-1).clamp(min=1e-10)  # each row's ideal DCG
    gain = (2.0 ** by_prediction - 1) / best[:, None]
    gaps = torch.abs(gain[:, :, None] - gain[:, None, :])
    apart = torch.abs(ranks[:, None] - ranks[None, :]).long()  # |i - j|
    deltas = torch.abs(1.0 / discount[0, apart - 1] - 1.0 / discount[0, apart])  # |i - j| = 0 reads D(0) = 0 ...
    deltas.fill_diagonal_(0.0)  # ... and the diagonal (i = j) weighs nothing
    lambdarank = torch.abs(1.0 / discount[:, :, None] - 1.0 / discount[:, None, :]) * gaps
    weights = LAMBDA_MU * deltas[None] * gaps + lambdarank
    diffs = (sorted_scores[:, :, None] - sorted_scores[:, None, :]).clamp(min=-1e8, max=1e8).nan_to_num(nan=0.0)
    losses = weights * F.logsigmoid(LAMBDA_SIGMA * diffs) / math.log(2)
    chosen = losses[pairs]
    return -chosen.sum() / max(chosen.numel(), 1)


def mnrl_loss(logits: Tensor, sizes: Sequence[int], labels: Tensor) -> Tensor:
    """Cross-entropy over each row's candidates (its positive first, then in-batch and hard negatives, all rows of
    equal width: `RerankTraining` builds them), the logits through a sigmoid times the scale."""
    scores = logits.view(len(sizes), sizes[0])
    target = torch.zeros(len(sizes), dtype=torch.long, device=logits.device)
    return F.cross_entropy(torch.sigmoid(scores) * MNRL_SCALE, target)


@dataclass(frozen=True)
class RerankLoss:
    """A reranking loss: what it batches ("pairs", "rows", or "in-batch": rows plus negatives from the batch's other
    rows) and its function of the batch's logits, the documents per row and the labels."""

    batches: str
    fn: Callable[[Tensor, Sequence[int], Tensor], Tensor]


RERANK_LOSSES: dict[str, RerankLoss] = {
    "bce": RerankLoss("pairs", bce_loss),
    "mse": RerankLoss("pairs", mse_loss),
    "listnet": RerankLoss("rows", listnet_loss),
    "lambdaloss": RerankLoss("rows", lambda_loss),
    "mnrl": RerankLoss("in-batch", mnrl_loss),
}
DEFAULT_RERANK_LOSS = "bce"
