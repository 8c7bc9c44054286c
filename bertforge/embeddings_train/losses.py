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
* `margin-mse` — distillation from a cross-encoder (Hofstätter et al. 2020): the mean squared error between each
  triplet's margin of dot products, q·p - q·n, and the teacher's margin (`MarginMSELoss`, `SparseMarginMSELoss`).

Sparse (SPLADE) training uses them on dot products (mnrl's `similarity="dot"`, scale 1: sentence-transformers'
`SparseMultipleNegativesRankingLoss`) inside `Splade`, which adds the FLOPS regularizers (Paria et al. 2020) of the
queries and of the documents, each weight warmed up quadratically (`regularizer_weight`) as sentence-transformers'
`SpladeLoss` with its `SpladeRegularizerWeightSchedulerCallback` does (`tests/embeddings_train/test_losses.py`
compares the values).
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


def dot_matrix(a: Tensor, b: Tensor) -> Tensor:
    """Dot product of every row of a [n, H] with every row of b [m, H] → [n, m]."""
    return a @ b.T


SIMILARITY_MATRICES = {"cosine": cosine_matrix, "dot": dot_matrix}


def mnrl(columns: Sequence[Tensor], labels: Tensor | None = None, *, scale: float = 20.0, symmetric: bool = False,
         similarity: str = "cosine") -> Tensor:
    """Multiple-negatives ranking loss; anchor i's positive is candidate i of [positives; negatives...]."""
    anchors, candidates = columns[0], torch.cat(list(columns[1:]))  # [B, H], [B * (columns - 1), H]
    scores = SIMILARITY_MATRICES[similarity](anchors, candidates) * scale  # [B, B * (columns - 1)]
    targets = torch.arange(len(anchors), device=anchors.device)
    loss = F.cross_entropy(scores, targets)
    if symmetric:  # positive i against every anchor: the transposed anchor-positive block
        loss = (loss + F.cross_entropy(scores[:, : len(anchors)].T, targets)) / 2
    return loss


def cosent(columns: Sequence[Tensor], labels: Tensor | None, *, scale: float = 20.0, symmetric: bool = False,
           similarity: str = "cosine") -> Tensor:
    """CoSENT over the batch's scored pairs: log(1 + Σ_{score_i > score_j} exp(scale · (cos_j - cos_i)))."""
    assert labels is not None
    cos = F.cosine_similarity(columns[0], columns[1], dim=-1) * scale  # [B]
    diff = cos[:, None] - cos[None, :]  # [B, B]: cos_i - cos_j
    ordered = labels[:, None] < labels[None, :]  # score_i < score_j: cos_i should be below cos_j
    terms = torch.cat([diff.new_zeros(1), diff[ordered]])
    return torch.logsumexp(terms, dim=0)


def cosine_mse(columns: Sequence[Tensor], labels: Tensor | None, *, scale: float = 20.0, symmetric: bool = False,
               similarity: str = "cosine") -> Tensor:
    """Mean squared error of each pair's cosine against its score (`scale` does not apply)."""
    assert labels is not None
    return F.mse_loss(F.cosine_similarity(columns[0], columns[1], dim=-1), labels)


def margin_mse(columns: Sequence[Tensor], labels: Tensor | None, *, scale: float = 20.0, symmetric: bool = False,
               similarity: str = "dot") -> Tensor:
    """Mean squared error of each triplet's dot-product margin q·p - q·n against the teacher's (`labels` [B])."""
    assert labels is not None
    query, positive, negative = columns[0], columns[1], columns[2]
    margins = (query * positive).sum(-1) - (query * negative).sum(-1)  # [B]
    return F.mse_loss(margins, labels.to(margins.dtype))


LOSSES: dict[str, Callable[..., Tensor]] = {"mnrl": mnrl, "cosent": cosent, "cosine": cosine_mse,
                                            "margin-mse": margin_mse}


def make_loss(name: str, scale: float = 20.0, symmetric: bool = False, matryoshka_dims: Sequence[int] = (),
              similarity: str = "cosine") -> Loss:
    """The loss called `name` with its settings; with `matryoshka_dims`, summed over those embedding prefixes.
    `similarity`: mnrl's, "cosine" or "dot" (sparse vectors)."""
    base = LOSSES[name]
    options = {"scale": scale, "symmetric": symmetric, **({"similarity": similarity} if name == "mnrl" else {})}

    def loss(columns: Sequence[Tensor], labels: Tensor | None) -> Tensor:
        if not matryoshka_dims:
            return base(columns, labels, **options)
        total = columns[0].new_zeros(())
        for dim in matryoshka_dims:
            total = total + base([c[:, :dim] for c in columns], labels, **options)
        return total

    return loss


def flops(vectors: Tensor) -> Tensor:
    """The FLOPS regularizer of a batch of sparse vectors [n, V]: Σ_v (mean_i vectors[i, v])², a smooth stand-in
    for the expected number of multiplications of a dot product between two of them (`FlopsLoss`)."""
    return vectors.mean(dim=0).pow(2).sum()


#: The share of the steps over which the regularizers' weights rise (sentence-transformers' callback's default)
REGULARIZER_WARMUP = 1 / 3


def regularizer_weight(weight: float, step: int, total_steps: int, warmup: float = REGULARIZER_WARMUP) -> float:
    """A regularizer's weight at optimizer step `step` (0 for the first) of `total_steps`: weight · (step / w)² for
    the first w = int(total_steps · warmup) steps (at least 1), then `weight` (`SpladeRegularizerWeightScheduler
    Callback`'s quadratic schedule, read at each step's beginning)."""
    steps = max(int(total_steps * warmup), 1)
    return weight if step >= steps else weight * (step / steps) ** 2


class Splade:
    """A loss on sparse vectors plus the FLOPS regularizers of the queries (`columns[0]`) and of the documents
    (every other column, together), as sentence-transformers' `SpladeLoss`: base + w_q · flops(queries) + w_d ·
    flops(documents), the weights those of step `step` of `total_steps` (`regularizer_weight`; the trainer sets
    `step`). After each call, `terms` holds the three parts and `nonzero` the mean count of non-zero entries of a
    query's and of a document's vector (detached)."""

    def __init__(self, base: Loss, query_weight: float, document_weight: float, total_steps: int = 1) -> None:
        self.base, self.query_weight, self.document_weight = base, query_weight, document_weight
        self.total_steps, self.step = total_steps, 0
        self.terms: dict[str, Tensor] = {}
        self.nonzero: dict[str, Tensor] = {}

    def weights(self) -> tuple[float, float]:
        """The query and document regularizers' weights at `step`."""
        return (regularizer_weight(self.query_weight, self.step, self.total_steps),
                regularizer_weight(self.document_weight, self.step, self.total_steps))

    def __call__(self, columns: Sequence[Tensor], labels: Tensor | None) -> Tensor:
        queries, documents = columns[0], torch.cat(list(columns[1:]))  # [B, V], [B * (columns - 1), V]
        query_weight, document_weight = self.weights()
        base = self.base(columns, labels)
        query, document = flops(queries) * query_weight, flops(documents) * document_weight
        self.terms = {"base_loss": base.detach(), "query_regularizer_loss": query.detach(),
                      "document_regularizer_loss": document.detach()}
        self.nonzero = {"query_nonzero": (queries != 0).sum(-1).float().mean().detach(),
                        "document_nonzero": (documents != 0).sum(-1).float().mean().detach()}
        return base + query + document
