"""Sparse (SPLADE) embeddings: a vocabulary-sized vector per text from the model's MLM head."""

from __future__ import annotations


import numpy as np
import torch
from torch import Tensor

from ..model import BertForMaskedLM, BertPreTrainedModel
from ..model.attention import PackedBatch
from .base import Feature, VectorPipeline
from .fill_mask import check_mlm_head


class SparseEmbedPipeline(VectorPipeline):
    """`pipeline("sparse-embed", model=DIR)`: SPLADE's document vectors — for each text, log(1 + relu(logits)) of
    the MLM head, max-pooled over its tokens (special tokens included; a packed batch has no padding): float32
    [vocab] per text, most entries 0 for a trained SPLADE model. The model directory needs an MLM head (a
    checkpoint saved from BertForMaskedLM or BertForPreTraining). One text → [vocab]; a list → [n, vocab].
    `nonzero(row)` gives a row's (indices, values), the shape text-embeddings-inference's /embed_sparse answers.
    """

    task = "sparse-embed"
    model_class = BertForMaskedLM

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        check_mlm_head(model, source)

    def vector_size(self) -> int:
        return self.model.config.vocab_size

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        model: BertForMaskedLM = self.model  # type: ignore[assignment]
        rows = []
        for start, n in zip(batch.starts, batch.lengths):  # one sequence at a time: [n, V] logits, not [T, V]
            logits = model.mlm_logits(hidden[start:start + n]).float()  # type: ignore[misc]  # [n, V]
            rows.append(torch.log1p(torch.relu(logits)).amax(dim=0).cpu().numpy())  # [V]
        return rows


def nonzero(row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A sparse vector's non-zero entries: their indices (int64) and values (float32), by index."""
    indices = np.flatnonzero(row)
    return indices, row[indices]


__all__ = ["SparseEmbedPipeline", "nonzero"]
