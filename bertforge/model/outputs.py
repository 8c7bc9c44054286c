"""What the models return: dataclasses with `transformers`' field names, readable by name or position.

Shapes: B = batch, S = sequence length, H = hidden size, nh = heads, V = vocabulary, N = labelled positions.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor


class ModelOutput:
    """Fields by name (`out.loss`, `out["loss"]`); `to_tuple()` gives the fields that are set, in order."""

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            return getattr(self, key)
        return self.to_tuple()[key]

    def keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None]  # type: ignore[arg-type]

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(getattr(self, k) for k in self.keys())


@dataclass
class BaseModelOutput(ModelOutput):
    last_hidden_state: Tensor  # [B, S, H]
    pooler_output: Tensor | None = None  # [B, H]
    hidden_states: tuple[Tensor, ...] | None = None  # embeddings + each layer, [B, S, H] each
    attentions: tuple[Tensor, ...] | None = None  # each layer, [B, nh, S, S]


@dataclass
class PreTrainingOutput(ModelOutput):
    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    prediction_logits: Tensor | None = None  # [B, S, V]; [N, V] (labelled positions only) with sparse MLM
    seq_relationship_logits: Tensor | None = None  # [B, 2]
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


@dataclass
class MaskedLMOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, S, V]; [N, V] with sparse MLM
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None

    # PreTrainingOutput's names, so that pretraining reads an MLM-only family's output as it reads BERT's
    mlm_loss = property(lambda self: self.loss)
    prediction_logits = property(lambda self: self.logits)
    nsp_loss = None
    seq_relationship_logits = None


@dataclass
class SequenceClassifierOutput(ModelOutput):
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, num_labels] or [B, S, num_labels] for token classification
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


TokenClassifierOutput = SequenceClassifierOutput
NextSentencePredictorOutput = SequenceClassifierOutput


@dataclass
class QuestionAnsweringOutput(ModelOutput):
    loss: Tensor | None = None
    start_logits: Tensor | None = None  # [B, S]
    end_logits: Tensor | None = None  # [B, S]
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None


__all__ = ["BaseModelOutput", "MaskedLMOutput", "ModelOutput", "NextSentencePredictorOutput", "PreTrainingOutput",
           "QuestionAnsweringOutput", "SequenceClassifierOutput", "TokenClassifierOutput"]
