"""The model: one encoder assembled from parts by a spec (`spec`, `parts`, `encoder`), attention and its layouts
(`attention`), the task heads (`heads`), the models (`models`) and what they return (`outputs`)."""

from ..core.constants import IGNORE_INDEX
from .spec import EncoderSpec, LayerAttention, RelativeAttention  # first: the config and the parts read it
from .config import BertConfig
from .attention import Layout, Packed, PackedBatch, Padded, Scores, Unpadded, extended_attention_mask, pack
from .encoder import (BertAttention, BertEmbeddings, BertEncoder, BertIntermediate, BertLayer, BertPooler,
                      BertResidualOutput, BertSelfAttention, padded_position_ids)
from .heads import BertLMPredictionHead, BertPredictionHeadTransform, BertPreTrainingHeads, FirstTokenHead, masked_lm
from .models import (MODEL_CLASSES, BertForMaskedLM, BertForMultipleChoice, BertForNextSentencePrediction,
                     BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification, BertModel,
                     BertPreTrainedModel)
from .outputs import (BaseModelOutput, MaskedLMOutput, ModelOutput, NextSentencePredictorOutput, PreTrainingOutput,
                      QuestionAnsweringOutput, SequenceClassifierOutput, TokenClassifierOutput)
from .parts import Dense, Embedding, LayerNorm

__all__ = [
    "IGNORE_INDEX", "MODEL_CLASSES", "BaseModelOutput", "BertConfig", "BertAttention", "BertEmbeddings", "BertEncoder",
    "BertForMaskedLM", "BertForMultipleChoice", "BertForNextSentencePrediction", "BertForPreTraining", "BertForQuestionAnswering",
    "BertForSequenceClassification", "BertForTokenClassification", "BertIntermediate", "BertLMPredictionHead",
    "BertLayer", "BertModel", "BertPooler", "BertPreTrainedModel", "BertPredictionHeadTransform",
    "BertPreTrainingHeads", "BertResidualOutput", "BertSelfAttention", "Dense", "Embedding", "EncoderSpec",
    "FirstTokenHead", "LayerAttention", "LayerNorm", "Layout", "MaskedLMOutput", "ModelOutput",
    "NextSentencePredictorOutput", "Packed", "PackedBatch", "Padded", "PreTrainingOutput", "QuestionAnsweringOutput",
    "RelativeAttention", "Scores", "SequenceClassifierOutput", "TokenClassifierOutput", "Unpadded",
    "extended_attention_mask", "masked_lm", "pack", "padded_position_ids",
]
