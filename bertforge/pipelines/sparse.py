"""Sparse (SPLADE) embeddings: a vocabulary-sized vector per text from the model's MLM head."""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from ..model import BertForMaskedLM, BertPreTrainedModel
from ..model.attention import PackedBatch
from ..model.checkpoint import check_mlm_head
from ..model.pooling import splade_pool
from .base import Feature
from .embed import SentenceTransformersVectors


class SparseEmbedPipeline(SentenceTransformersVectors):
    """`pipeline("sparse-embed", model=DIR)` (or "sparse", "splade"): SPLADE's vectors — for each text,
    log(1 + relu(logits)) of the MLM head, max-pooled over its tokens (special tokens included; a packed batch has
    no padding), as sentence-transformers' SparseEncoder computes them (`model.pooling.splade_pool`): float32
    [vocab] per text, most entries 0 for a trained SPLADE model. The model directory needs an MLM head (a
    checkpoint saved from BertForMaskedLM or BertForPreTraining, or a SparseEncoder directory, such as
    `train-embeddings --sparse splade` writes: its max_seq_length and prompts apply, see
    `SentenceTransformersVectors`). One text → [vocab]; a list → [n, vocab]. `nonzero(row)` gives a row's (indices,
    values), the shape text-embeddings-inference's /embed_sparse answers.
    """

    task = "sparse-embed"
    model_class = BertForMaskedLM

    def __init__(self, model: Any, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.similarity = "dot"  # a SparseEncoder's similarity_fn_name

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        check_mlm_head(model, source)

    def vector_size(self) -> int:
        return self.model.config.vocab_size

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        model: Any = self.model  # a BertForMaskedLM or BertForPreTraining: its MLM head's logits
        return list(splade_pool(model.mlm_logits, hidden, batch.lengths).cpu().numpy())  # [V] rows


def nonzero(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A sparse vector's non-zero entries: their indices (int64) and values (float32), by index."""
    indices = np.flatnonzero(row)
    return indices, row[indices]


__all__ = ["SparseEmbedPipeline", "nonzero"]
