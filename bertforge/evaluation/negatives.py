"""Hard-negative mining: for each (anchor, positive) pair, negatives from a corpus ranked by an embedding model, the
choices sentence-transformers' `mine_hard_negatives` makes for the same parameters.

The model comes as functions (texts → unit-length vectors), as in `evaluators`. The steps, in its order:

* The corpus is the given documents (default: the positives) and every positive, duplicates dropped (first
  occurrence kept); the anchors are deduplicated too, and all the positives of an anchor are its positives.
* Each anchor's `range_max + max_positives + 1` best documents (max_positives: the most rows one anchor has) by
  exact top-k (`topk.TopK`, ties to the lower corpus position), optionally rescored by a cross-encoder (then the
  positives' scores are the cross-encoder's too).
* Excluded, in the candidates: the anchor's positives, the anchor's own text, and those a filter drops: within
  `margin` of the anchor's lowest positive score (`score + margin > positive`), above `positive - |positive| *
  relative_margin`, above `max_score`, below `min_score`.
* What remains, best first, cut to the window `range_min:range_max` of that order; `sampling` "top" takes its first
  `num_negatives`, "random" a uniform sample of that many of its valid candidates (then sorted best first).
* Rows: "triplet" one (anchor, positive, negative) per negative found; "n-tuple" one (anchor, positive, negative_1,
  ..., negative_N) per pair that found all N (others are dropped). Rows come anchor by anchor, in the order of each
  anchor's first row.

`range_max` defaults, as there, to `range_min + num_negatives + max_positives`, or `range_min + 10 * num_negatives +
max_positives` when a filter (a margin, a maximum score, or a minimum score with a cross-encoder) may drop candidates.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.constants import SEED
from ..core.errors import BertforgeError
from .metrics import SIMILARITIES, pairwise_similarity
from .topk import TopK

SAMPLINGS = ("top", "random")
OUTPUT_FORMATS = ("triplet", "n-tuple")
Embed = Callable[[list[str]], Tensor]
ScorePairs = Callable[[list[tuple[str, str]]], Sequence[float]]


@dataclass(frozen=True)
class MiningSettings:
    """The choices of a mining run (sentence-transformers' parameters of the same names; `margin` is its
    `absolute_margin`)."""

    range_min: int = 0
    range_max: int | None = None
    margin: float | None = None
    relative_margin: float | None = None
    max_score: float | None = None
    min_score: float | None = None
    num_negatives: int = 3
    sampling: str = "top"
    output_format: str = "triplet"
    seed: int = SEED

    def window(self, max_positives: int, reranked: bool) -> tuple[int, int]:
        """(range_min, range_max), range_max derived when not given; a BertforgeError for a window that cannot
        hold `num_negatives`."""
        if self.sampling not in SAMPLINGS:
            raise BertforgeError(f"sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}")
        if self.output_format not in OUTPUT_FORMATS:
            raise BertforgeError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        if self.num_negatives < 1:
            raise BertforgeError(f"num_negatives must be at least 1, got {self.num_negatives}")
        if self.range_min < 0:
            raise BertforgeError(f"range_min must be 0 or more, got {self.range_min}")
        range_max = self.range_max
        if range_max is None:
            filtered = (self.margin is not None or self.relative_margin is not None or self.max_score is not None
                        or (reranked and self.min_score is not None))
            range_max = self.range_min + self.num_negatives * (10 if filtered else 1) + max_positives
        if self.range_min >= range_max:
            raise BertforgeError(f"range_min must be smaller than range_max, got range_min={self.range_min} and "
                                 f"range_max={range_max}")
        if self.num_negatives > range_max - self.range_min:
            raise BertforgeError(f"cannot mine {self.num_negatives} negatives per pair: the window range_min="
                                 f"{self.range_min}..range_max={range_max} holds {range_max - self.range_min}")
        return self.range_min, range_max


def mine_negatives(anchors: Sequence[str], positives: Sequence[str], embed_queries: Embed, embed_corpus: Embed,
                   settings: MiningSettings = MiningSettings(), *, corpus: Sequence[str] | None = None,
                   similarity: str = "cosine", rerank: ScorePairs | None = None) -> list[dict[str, str]]:
    """The mined rows ({"anchor", "positive", "negative"} or {"anchor", "positive", "negative_1", ...}) of the
    pairs `anchors[i]`, `positives[i]` (see the module docstring). `embed_*` return unit-length vectors [n, H];
    `similarity` names one of `metrics.SIMILARITIES`; `rerank` scores (anchor, document) pairs."""
    if len(anchors) != len(positives) or not anchors:
        raise BertforgeError(f"need as many anchors as positives, at least one: got {len(anchors)} and {len(positives)}")
    if similarity not in SIMILARITIES:
        raise BertforgeError(f"unknown similarity {similarity!r}; choose one of {', '.join(SIMILARITIES)}")
    max_positives = max(Counter(anchors).values())
    range_min, range_max = settings.window(max_positives, rerank is not None)
    documents = list(dict.fromkeys([*(positives if corpus is None else corpus), *positives]))
    position = {text: i for i, text in enumerate(documents)}
    queries = list(dict.fromkeys(anchors))
    own = {text: i for i, text in enumerate(queries)}
    positive_ids: list[list[int]] = [[] for _ in queries]
    for anchor, positive in zip(anchors, positives):
        row = positive_ids[own[anchor]]
        if position[positive] not in row:
            row.append(position[positive])

    query_vectors, document_vectors = embed_queries(queries).float(), embed_corpus(documents).float()
    wanted = range_max + max_positives + 1
    best = TopK(query_vectors, min(wanted, len(documents)), SIMILARITIES[similarity])
    best.add(document_vectors)
    scores, ids = best.values, best.positions
    if ids.shape[1] < wanted:  # a corpus smaller than the candidates asked for: padded with nothing
        missing = wanted - ids.shape[1]
        scores = torch.cat([scores, scores.new_full((len(queries), missing), -torch.inf)], dim=1)
        ids = torch.cat([ids, ids.new_full((len(queries), missing), -1)], dim=1)
    flat = [(q, d) for q, row in enumerate(positive_ids) for d in row]
    positive_scores = pairwise_similarity(similarity, query_vectors[[q for q, _ in flat]],
                                          document_vectors[[d for _, d in flat]])
    if rerank is not None:
        real = ids >= 0
        rescored = rerank([(queries[q], documents[int(ids[q, c])]) for q, c in real.nonzero().tolist()])
        scores = scores.new_full(scores.shape, -torch.inf)
        scores[real] = torch.tensor([float(value) for value in rescored])  # row-major: the order of nonzero()
        positive_scores = torch.tensor([float(s) for s in rerank([(queries[q], documents[d]) for q, d in flat])])

    excluded = ids < 0
    for q, row in enumerate(positive_ids):
        drop = set(row) | ({position[queries[q]]} if queries[q] in position else set())
        excluded[q] |= torch.isin(ids[q], torch.tensor(sorted(drop), dtype=torch.long))
    scores = scores.masked_fill(excluded, -torch.inf)
    hardest = torch.empty(len(queries))
    start = 0
    for q, row in enumerate(positive_ids):  # the lowest positive score: the margins' reference
        hardest[q] = positive_scores[start:start + len(row)].min()
        start += len(row)
    hardest = hardest[:, None]
    if settings.margin is not None:
        scores = scores.masked_fill(scores + settings.margin > hardest, -torch.inf)
    if settings.relative_margin is not None:
        scores = scores.masked_fill(scores > hardest - hardest.abs() * settings.relative_margin, -torch.inf)
    if settings.max_score is not None:
        scores = scores.masked_fill(scores > settings.max_score, -torch.inf)
    if settings.min_score is not None:
        scores = scores.masked_fill(scores < settings.min_score, -torch.inf)

    scores, order = scores.sort(dim=1, descending=True, stable=True)
    scores, ids = scores[:, range_min:range_max], ids.gather(1, order)[:, range_min:range_max]
    n = settings.num_negatives
    if settings.sampling == "top":
        scores, ids = scores[:, :n], ids[:, :n]
    else:
        rng = random.Random(settings.seed)
        valid = (~scores.isinf()).sum(dim=1).clamp(min=n).tolist()
        picked = torch.tensor([sorted(rng.sample(range(options), n)) for options in valid], dtype=torch.long)
        scores, ids = scores.gather(1, picked), ids.gather(1, picked)  # ascending positions: still best first

    rows: list[dict[str, str]] = []
    for q, row in enumerate(positive_ids):
        found = [documents[int(i)] for i, s in zip(ids[q], scores[q]) if s != -torch.inf]
        for d in row:
            if settings.output_format == "triplet":
                rows.extend({"anchor": queries[q], "positive": documents[d], "negative": text} for text in found)
            elif len(found) == n:
                rows.append({"anchor": queries[q], "positive": documents[d],
                             **{f"negative_{i}": text for i, text in enumerate(found, start=1)}})
    return rows
