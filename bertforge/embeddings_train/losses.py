"""The losses of sentence-embedding training, on a batch's embeddings column by column.

Each takes `columns` (a list of [B, H] tensors: anchors, positives or second sentences, then hard negatives) and
`labels` (the scores of scored pairs, [B]; None for pairs and triplets) and returns the batch's mean loss. They are
the losses sentence-transformers computes (`tests/embeddings_train/test_losses.py` checks the values against
`MultipleNegativesRankingLoss`, `CoSENTLoss`, `CosineSimilarityLoss` and `MatryoshkaLoss` on the same embeddings):

* `mnrl` — multiple-negatives ranking (in-batch negatives; van den Oord et al. 2018, Henderson et al. 2017): each
  anchor's positive is the right answer among every positive and hard negative of the batch, a cross-entropy over
  cosine similarities times `scale`. `symmetric` adds the reverse direction (each positive ranks the anchors) and
  takes the mean of the two.
* `cosent` — CoSENT (Su 2022): for every two pairs whose gold scores are ordered, a softplus-like penalty when the
  cosines are not: log(1 + Σ exp(scale · (cos_j - cos_i))) over the pairs with score_i > score_j.
* `cosine` — the mean squared error between the cosine of each pair and its score.
* `matryoshka` — a loss summed over prefixes of the embeddings (Kusupati et al. 2022); the cosine inside each loss
  re-normalises the truncated vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

Loss = Callable[[Sequence[Tensor], Tensor | None], Tensor]


def cosine_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Cosine similarity of every row of a [n, H] with every row of b [m, H] → [n, m]."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def mnrl(columns: Sequence[Tensor], labels: Tensor | None = None, *, scale: float = 20.0, symmetric: bool = False) -> Tensor:
    """Multiple-negatives ranking loss; anchor i's positive is candidate i of [positives; negatives...]."""
    anchors, candidates = columns[0], torch.cat(list(columns[1:]))  # [B, H], [B * (columns - 1), H]
    scores = cosine_matrix(anchors, candidates) * scale  # [B, B * (columns - 1)]
    targets = torch.arange(len(anchors), device=anchors.device)
    loss = F.cross_entropy(scores, targets)
    if symmetric:  # positive i against every anchor: the transposed anchor-positive block
        loss = (loss + F.cross_entropy(scores[:, : len(anchors)].T, targets)) / 2
    return loss


def cosent(columns: Sequence[Tensor], labels: Tensor | None, *, scale: float = 20.0, symmetric: bool = False) -> Tensor:
    """CoSENT over the batch's scored pairs: log(1 + Σ_{score_i > score_j} exp(scale · (cos_j - cos_i)))."""
    assert labels is not None
    cos = F.cosine_similarity(columns[0], columns[1], dim=-1) * scale  # [B]
    diff = cos[:, None] - cos[None, :]  # [B, B]: cos_i - cos_j
    ordered = labels[:, None] < labels[None, :]  # score_i < score_j: cos_i should be below cos_j
    terms = torch.cat([diff.new_zeros(1), diff[ordered]])
    return torch.logsumexp(terms, dim=0)


def cosine_mse(columns: Sequence[Tensor], labels: Tensor | None, *, scale: float = 20.0, symmetric: bool = False) -> Tensor:
    """Mean squared error of each pair's cosine against its score (`scale` does not apply)."""
    assert labels is not None
    return F.mse_loss(F.cosine_similarity(columns[0], columns[1], dim=-1), labels)


LOSSES: dict[str, Callable[..., Tensor]] = {"mnrl": mnrl, "cosent": cosent, "cosine": cosine_mse}


def make_loss(name: str, scale: float = 20.0, symmetric: bool = False, matryoshka_dims: Sequence[int] = ()) -> Loss:
    """The loss called `name` with its settings; with `matryoshka_dims`, summed over those embedding prefixes."""
    base = LOSSES[name]

    def loss(columns: Sequence[Tensor], labels: Tensor | None) -> Tensor:
        if not matryoshka_dims:
            return base(columns, labels, scale=scale, symmetric=symmetric)
        total = columns[0].new_zeros(())
        for dim in matryoshka_dims:
            total = total + base([c[:, :dim] for c in columns], labels, scale=scale, symmetric=symmetric)
        return total

    return loss
