"""DistilBERT (Sanh et al., 2019): no token types, no pooler, a first-token sequence head with ReLU, its own
parameter names; MLM only."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from .family import INTERNAL_LAYER, BertParts, Family

if TYPE_CHECKING:
    from ..config import BertConfig

_DISTIL_LAYER = "bert.transformer.layer.{n}."


def distilbert_student(config: BertConfig, layers: list[int]) -> BertConfig:
    """`Family.student` of BERT, RoBERTa, XLM-R and DistilBERT: a DistilBERT of len(layers) layers (no token types,
    ε 1e-12, positions from 0 as many as the teacher takes: its first token-type row and RoBERTa's offset are folded
    in when the weights are copied)."""
    return replace(config, model_type="distilbert", num_hidden_layers=len(layers), type_vocab_size=0,
                   layer_norm_eps=1e-12, max_position_embeddings=config.max_sequence_length, extra={})


DISTILBERT = Family(
    model_type="distilbert",
    name="DistilBERT",
    class_prefix="DistilBert",
    prefix="distilbert",
    body=("embeddings", "transformer"),
    parts=BertParts(pooler=False, sequence_head="first-token", sequence_act="relu", dropout_before_dense=False),
    sentence_head=None,
    student=distilbert_student,
    config_keys=dict(
        dim="hidden_size",
        n_layers="num_hidden_layers",
        n_heads="num_attention_heads",
        hidden_dim="intermediate_size",
        activation="hidden_act",
        dropout="hidden_dropout_prob",
        attention_dropout="attention_probs_dropout_prob",
        seq_classif_dropout="classifier_dropout",
    ),
    defaults=dict(
        vocab_size=30522, hidden_size=768, num_hidden_layers=6, num_attention_heads=12, intermediate_size=3072,
        hidden_act="gelu", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, classifier_dropout=0.2,
        type_vocab_size=0, layer_norm_eps=1e-12,
    ),
    unused=("type_vocab_size", "layer_norm_eps", "embedding_size", "num_hidden_groups"),
    written={"tie_word_embeddings": True},
    keys=(
        (_DISTIL_LAYER + "attention.q_lin.", INTERNAL_LAYER + "attention.self.query."),
        (_DISTIL_LAYER + "attention.k_lin.", INTERNAL_LAYER + "attention.self.key."),
        (_DISTIL_LAYER + "attention.v_lin.", INTERNAL_LAYER + "attention.self.value."),
        (_DISTIL_LAYER + "attention.out_lin.", INTERNAL_LAYER + "attention.output.dense."),
        (_DISTIL_LAYER + "sa_layer_norm.", INTERNAL_LAYER + "attention.output.LayerNorm."),
        (_DISTIL_LAYER + "ffn.lin1.", INTERNAL_LAYER + "intermediate.dense."),
        (_DISTIL_LAYER + "ffn.lin2.", INTERNAL_LAYER + "output.dense."),
        (_DISTIL_LAYER + "output_layer_norm.", INTERNAL_LAYER + "output.LayerNorm."),
        ("vocab_transform.", "cls.predictions.transform.dense."),
        ("vocab_layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("vocab_projector.bias", "cls.predictions.bias"),
        ("pre_classifier.", "classifier.dense."),
        ("classifier.", "classifier.out_proj."),  # the sequence head's; a token classifier keeps `classifier.`
    ),
    dropped=(r"^vocab_projector\.weight$",),
    preset=dict(type_vocab_size=0, classifier_dropout=0.2),
)
