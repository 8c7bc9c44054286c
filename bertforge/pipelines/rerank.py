"""Reranking with a cross-encoder: score (query, passage) pairs with a sequence-classification model, sort them.

    >>> rerank = bertforge.pipeline("rerank", model="ms-marco-MiniLM-L6-v2/")
    >>> rerank("who wrote hamlet?", ["Hamlet is a play by Shakespeare.", "Paris is in France."])
    [{'corpus_id': 0, 'score': 0.99...}, {'corpus_id': 1, 'score': 0.0001...}]

The answer has the shape of sentence-transformers' `CrossEncoder.rank`, and the scores are those of its `predict`:
the same default activation (the one sentence-transformers saved with the model, else a sigmoid for a one-logit model
and the raw logits for more), here taken from the last label (the "relevant" class) when the
model has several. The pairs go through text classification's pair path: tokenized as [CLS] query [SEP] passage
[SEP], sorted by length, packed without padding, all queries' pairs in the same batches.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import BertforgeError
from .base import Feature, Pipeline
from .classification import SCORE_FUNCTIONS, TextClassificationPipeline

log = logging.getLogger("bertforge")

#: sentence-transformers' activation modules (as config.json names them) and the score function of each.
ST_ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "none", "Softmax": "softmax"}


def sentence_transformers_activation(directory: Path | None, config: Any) -> str | None:
    """The score function a CrossEncoder saved by sentence-transformers declares, or None when it names none.

    Looked up where sentence-transformers looks, in its order: "activation_fn" in config_sentence_transformers.json
    (v6), {"sentence_transformers": {"activation_fn": ...}} in config.json (v4, v5), then config.json's
    "sbert_ce_default_activation_function" (older); the value is a class path such as
    "torch.nn.modules.activation.Sigmoid". An unreadable file is ignored: it only gives a default.
    """
    path = None
    if directory is not None:
        try:
            settings = json.loads((directory / "config_sentence_transformers.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            settings = None
        path = settings.get("activation_fn") if isinstance(settings, dict) else None
    extra = getattr(config, "extra", None) or {}
    settings = extra.get("sentence_transformers")
    path = path or (settings.get("activation_fn") if isinstance(settings, dict) else None)
    path = path or extra.get("sbert_ce_default_activation_function")
    if not isinstance(path, str) or not path:
        return None
    name = path.rsplit(".", 1)[-1]
    if name not in ST_ACTIVATIONS:
        log.warning("rerank: the model's activation %s is not supported; using the default (pass activation= to "
                    "choose one of %s)", path, ", ".join(SCORE_FUNCTIONS))
        return None
    return ST_ACTIVATIONS[name]


class RerankPipeline(TextClassificationPipeline):
    """`pipeline("rerank", model=DIR)`: `rerank(query, passages)` → the passages' indices and scores, best first,
    `[{"corpus_id", "score"(, "text")}]` as sentence-transformers' `CrossEncoder.rank`; a list of queries with a
    list of passages for each → one such list per query.

    Args:
        activation: "sigmoid", "softmax" (over the labels; models with several labels only) or "none" (the raw
            logit). Default: as sentence-transformers' CrossEncoder: the activation saved with the model, else
            "sigmoid" for a one-logit model and "none" for more. With several labels the score is the last label's.
        Other arguments: see `Pipeline`.
    """

    task = "rerank"
    input_description = "a (query, passage) tuple"

    def __init__(self, model: Any, *, activation: str | None = None, **kwargs: Any) -> None:
        for name in ("top_k", "function_to_apply"):
            if name in kwargs:
                raise BertforgeError(f"rerank: no {name}= option (top_k is an argument of each call; the score "
                                     "function is activation=)")
        super().__init__(model, function_to_apply="none", **kwargs)
        self.set_activation(activation)
        self.positive = self.model.config.num_labels - 1  # the score's label: the only one, or the last ("relevant")

    call_options = (*Pipeline.call_options, "activation")
    refused_options = {
        **Pipeline.refused_options,
        "function_to_apply": "the score function is activation= (sigmoid, softmax or none)",
    }
    call_arguments = ("top_k", "return_documents")

    def set_activation(self, activation: Any) -> None:
        """The score function; None: as sentence-transformers' CrossEncoder picks it."""
        labels = self.model.config.num_labels
        if activation is None:
            declared = sentence_transformers_activation(self.model_dir, self.model.config)
            activation = declared or ("sigmoid" if labels == 1 else "none")
        if activation not in SCORE_FUNCTIONS:
            raise BertforgeError(f"rerank: activation must be one of {', '.join(SCORE_FUNCTIONS)}, got {activation!r}")
        if activation == "softmax" and labels == 1:
            raise BertforgeError("rerank: activation='softmax' needs a model with several labels; this one has one")
        self.function_to_apply = activation

    def is_single(self, inputs: Any) -> bool:
        return isinstance(inputs, tuple) and len(inputs) == 2

    def check_input(self, item: Any, index: int) -> None:
        if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item)):
            raise BertforgeError(f"rerank: input {index} must be a (query, passage) tuple of strings, got {item!r:.80}")

    def postprocess(self, item: Any, outputs: list[np.ndarray], features: list[Feature]) -> float:
        return float(self.scores(outputs[0])[self.positive])

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        """The score of each (query, passage) pair, in order (as sentence-transformers' `CrossEncoder.predict`
        with one label)."""
        self.check_collection(pairs)
        return list(self.stream([tuple(p) if isinstance(p, list) else p for p in pairs]))  # [q, p] as ST takes

    @staticmethod
    def ranking(scores: Sequence[float], passages: Sequence[str] | None = None, top_k: int | None = None,
                return_documents: bool = False) -> list[dict[str, Any]]:
        """`[{"corpus_id", "score"(, "text")}]` best first (ties keep their order), the `top_k` best (None: all)."""
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_k]
        if not return_documents:
            return [{"corpus_id": i, "score": scores[i]} for i in order]
        if passages is None:
            raise BertforgeError("rerank: return_documents needs the passages")
        return [{"corpus_id": i, "score": scores[i], "text": passages[i]} for i in order]

    def __call__(self, query: Any, passages: Any = None, *, top_k: int | None = None,  # type: ignore[override]
                 return_documents: bool = False, **options: Any) -> Any:
        """One query and its passages → their ranking; a list of queries and a list of passage lists (one per
        query) → a list of rankings. All pairs are scored in the same length-sorted batches. `options`: settings
        for this call only (`call_options`)."""
        pipe = self.with_options(options)
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise BertforgeError(f"rerank: top_k must be a positive integer or None, got {top_k!r}")
        single = isinstance(query, str)
        queries, lists = ([query], [passages]) if single else (query, passages)
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise BertforgeError(f"rerank: query must be a string or a list of strings, got {query!r:.80}")
        if not isinstance(lists, list) or len(lists) != len(queries):
            raise BertforgeError(
                "rerank: with a list of queries, passages must be a list of the same length (a list of passages for "
                f"each query), got {type(passages).__name__} {passages!r:.80}"
            )
        for q, texts in enumerate(lists):
            if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
                where = "passages" if single else f"passages[{q}]"
                raise BertforgeError(f"rerank: {where} must be a list of strings, got {texts!r:.80}")
        scores = iter(pipe.stream([(q, t) for q, texts in zip(queries, lists) for t in texts]))
        rankings = [
            self.ranking([next(scores) for _ in texts], texts, top_k, return_documents) for texts in lists
        ]
        return rankings[0] if single else rankings
