"""The task heads on top of the encoder: the MLM head (transform → tied decoder), the sentence heads, the
first-token sequence head, and the MLM loss that projects only the labelled positions.

Shapes: B = batch, S = sequence length, H = hidden size, E = embedding width, V = vocabulary, N = labelled
(masked) positions in a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import BertConfig
from ..constants import IGNORE_INDEX
from ..errors import BertforgeError
from ..linear import linear
from ..ops import dropout
from .parts import Dense, LayerNorm


class BertPredictionHeadTransform(nn.Module):
    """dense (H → E) → activation → LayerNorm: the MLM head's transform, to the width of the word embeddings."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        act = config.family.mlm_head_act or config.hidden_act
        self.dense = Dense(config.hidden_size, config.embedding_dim, act=act)
        self.LayerNorm = LayerNorm(config.embedding_dim, config.layer_norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        return self.LayerNorm(self.dense(x))


class BertLMPredictionHead(nn.Module):
    """dense → GELU → LayerNorm → decoder whose weight is the word-embedding matrix (tied), plus a bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor, word_embeddings: Tensor) -> Tensor:
        return linear(self.transform(x), word_embeddings, self.bias)  # [..., V]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, mlm: bool = True, nsp: bool = True) -> None:
        super().__init__()
        if mlm:
            self.predictions = BertLMPredictionHead(config)
        if nsp:
            self.seq_relationship = Dense(config.hidden_size, 2)


def masked_lm(
    head: BertLMPredictionHead, word_embeddings: Tensor, sequence_output: Tensor, labels: Tensor | None, sparse: bool
) -> tuple[Tensor, Tensor | None]:
    """MLM logits and loss. With labels and `sparse`, only labelled positions reach the vocabulary projection:
    the loss is the same as projecting every position, at a fraction of the cost."""
    if labels is None:
        return head(sequence_output, word_embeddings), None  # [B, S, V]
    if sparse:
        labels = labels.reshape(-1)
        keep = (labels != IGNORE_INDEX).nonzero().squeeze(1)  # [N]
        logits = head(sequence_output.reshape(-1, sequence_output.shape[-1])[keep], word_embeddings)  # [N, V]
        target = labels[keep]
    else:
        logits = head(sequence_output, word_embeddings)  # [B, S, V]
        target = labels
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), target.reshape(-1), ignore_index=IGNORE_INDEX)
    return logits, loss


def require_sentence_head(config: BertConfig, cls: str, kinds: tuple[str, ...]) -> None:
    """Refuse a sentence-level pretraining head the family does not have (RoBERTa and DistilBERT: none)."""
    if config.family.sentence_head not in kinds:
        raise BertforgeError(
            f"{cls} needs a family with a {' or '.join(kinds)} head; {config.family.name} is pretrained with "
            f"{config.family.sentence_head or 'MLM only'} (use BertForMaskedLM)"
        )


class FirstTokenHead(nn.Module):
    """The sequence head of RoBERTa and DistilBERT, on the first token's hidden state (they have no pooler there):
    (dropout →) dense → tanh or ReLU → dropout → out_proj."""

    def __init__(self, config: BertConfig, p: float) -> None:
        super().__init__()
        h = config.hidden_size
        self.dense = Dense(h, h, act=config.family.sequence_head_act)
        self.out_proj = Dense(h, config.num_labels)
        self.p = p
        self.dropout_first = config.family.dropout_before_head_dense

    def forward(self, first: Tensor) -> Tensor:
        if self.dropout_first:
            first = dropout(first, self.p, self.training)
        return self.out_proj(dropout(self.dense(first), self.p, self.training))


__all__ = ["BertLMPredictionHead", "BertPreTrainingHeads", "BertPredictionHeadTransform", "FirstTokenHead", "masked_lm",
           "require_sentence_head"]
