"""The task heads on top of the encoder: the MLM head (transform → tied decoder), the sentence heads, the
first-token sequence head, sequence pooling, and the MLM loss that projects only the labelled positions. Their
shape is the spec's `HeadSpec`.

Shapes: B = batch, S = sequence length, H = hidden size, E = embedding width, V = vocabulary, N = labelled
(masked) positions in a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError
from ..core.linear import linear
from ..core.ops import dropout
from .config import BertConfig
from .parts import Dense, norm
from .spec import EncoderSpec


class BertPredictionHeadTransform(nn.Module):
    """dense (H → width) → activation → norm: the MLM head's transform, to the width of the word embeddings; and
    ModernBERT's head before its classifiers (width H; EuroBERT's without the norm: `with_norm` False)."""

    def __init__(self, spec: EncoderSpec, width: int, act: str, with_norm: bool = True) -> None:
        super().__init__()
        self.dense = Dense(spec.hidden_size, width, bias=spec.heads.transform_bias, act=act, role="out")
        self.LayerNorm = norm(spec, width) if with_norm else None

    def forward(self, x: Tensor) -> Tensor:
        x = self.dense(x)
        return self.LayerNorm(x) if self.LayerNorm is not None else x


class BertLMPredictionHead(nn.Module):
    """transform (unless the spec has none) → decoder whose weight is the word-embedding matrix (tied) or a
    matrix of its own (`HeadSpec.tied_decoder` False), plus a bias (unless the spec has none)."""

    def __init__(self, spec: EncoderSpec) -> None:
        super().__init__()
        heads = spec.heads
        if not heads.mlm_transform and heads.tied_decoder and spec.embedding_dim != spec.hidden_size:
            raise BertforgeError(f"encoder spec: an MLM head without a transform cannot tie its decoder to "
                                 f"{spec.embedding_dim}-wide embeddings of a {spec.hidden_size}-wide encoder")
        width = spec.embedding_dim if heads.mlm_transform else spec.hidden_size
        self.transform = BertPredictionHeadTransform(spec, width, heads.mlm_act) if heads.mlm_transform else None
        self.decoder = None if heads.tied_decoder else nn.Parameter(torch.empty(spec.vocab_size, width))  # [V, ·]
        self.bias = nn.Parameter(torch.zeros(spec.vocab_size)) if heads.decoder_bias else None

    def forward(self, x: Tensor, word_embeddings: Tensor) -> Tensor:
        """Vocabulary logits [..., V]; `word_embeddings` [V, E] is the decoder's weight where the head ties it."""
        if self.transform is not None:
            x = self.transform(x)
        return linear(x, word_embeddings if self.decoder is None else self.decoder, self.bias)  # [..., V]


class BertPreTrainingHeads(nn.Module):
    def __init__(self, spec: EncoderSpec, mlm: bool = True, nsp: bool = True) -> None:
        super().__init__()
        if mlm:
            self.predictions = BertLMPredictionHead(spec)
        if nsp:
            self.seq_relationship = Dense(spec.hidden_size, 2, role="head")


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
    """The sequence head of RoBERTa, DistilBERT and DeBERTa, on the first token's hidden state (they have no pooler
    there): (dropout →) dense → tanh, ReLU or GELU → dropout → out_proj; the first dropout's rate is the second's
    unless the spec says otherwise (DeBERTa's ContextPooler: `pooler_dropout`, then `cls_dropout`)."""

    def __init__(self, spec: EncoderSpec, num_labels: int, p: float) -> None:
        super().__init__()
        h = spec.hidden_size
        self.dense = Dense(h, h, act=spec.heads.sequence_act, role="head")
        self.out_proj = Dense(h, num_labels, role="final")
        self.p = p
        self.dropout_first = spec.heads.dropout_before_dense
        self.p_first = p if spec.heads.first_dropout is None else spec.heads.first_dropout

    def forward(self, first: Tensor) -> Tensor:
        if self.dropout_first:
            first = dropout(first, self.p_first, self.training)
        return self.out_proj(dropout(self.dense(first), self.p, self.training))


def _first_padded(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    return hidden[:, 0]  # as `transformers` takes it, padding or not


def _mean_padded(hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
    if attention_mask is None:
        return hidden.mean(dim=1)
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [B, S, 1]
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1)


#: The sequence heads' poolings (`HeadSpec.pooling`) of padded rows: (hidden [B, S, H], mask [B, S]) → [B, H].
PADDED_POOLERS = {"cls": _first_padded, "mean": _mean_padded, "late": _mean_padded}  # "late" pools logits


def pool_padded(hidden: Tensor, attention_mask: Tensor | None, how: str) -> Tensor:
    """Each sequence's vector [B, H] of padded hidden states [B, S, H]: position 0 ("cls"), or the mean of the real
    tokens ("mean"; all of them without a mask). Packed rows: `bertforge.model.pooling.pool`."""
    return PADDED_POOLERS[how](hidden, attention_mask)


__all__ = ["BertLMPredictionHead", "BertPreTrainingHeads", "BertPredictionHeadTransform", "FirstTokenHead",
           "PADDED_POOLERS", "masked_lm", "pool_padded", "require_sentence_head"]
