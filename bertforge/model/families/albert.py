"""ALBERT (Lan et al., 2019): embeddings of width E projected to H, every layer sharing one set of weights,
GELU-tanh, no dropout; MLM with n-gram masking and sentence-order prediction."""

from __future__ import annotations

from .family import INTERNAL_LAYER, WRITTEN, Family, Recipe

_ALBERT_LAYER = "bert.encoder.albert_layer_groups.{n}.albert_layers.0."


def embedding_width(hidden: int) -> dict[str, int]:
    """A preset's E: ALBERT's 128, at most half of H for the small sizes."""
    return {"embedding_size": min(128, hidden // 2)}


ALBERT = Family(
    model_type="albert",
    name="ALBERT",
    class_prefix="Albert",
    prefix="albert",
    sentence_head="SOP",
    config_keys=dict(classifier_dropout_prob="classifier_dropout"),
    defaults=dict(  # `transformers.AlbertConfig`'s (albert-xxlarge's sizes)
        vocab_size=30000, embedding_size=128, hidden_size=4096, num_hidden_layers=12, num_hidden_groups=1,
        num_attention_heads=64, intermediate_size=16384, hidden_act="gelu_new", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, classifier_dropout=0.1,
    ),
    written={**WRITTEN, "inner_group_num": 1},
    keys=(
        ("bert.encoder.embedding_hidden_mapping_in.", "bert.encoder.embedding_projection."),
        (_ALBERT_LAYER + "attention.query.", INTERNAL_LAYER + "attention.self.query."),
        (_ALBERT_LAYER + "attention.key.", INTERNAL_LAYER + "attention.self.key."),
        (_ALBERT_LAYER + "attention.value.", INTERNAL_LAYER + "attention.self.value."),
        (_ALBERT_LAYER + "attention.dense.", INTERNAL_LAYER + "attention.output.dense."),
        (_ALBERT_LAYER + "attention.LayerNorm.", INTERNAL_LAYER + "attention.output.LayerNorm."),
        (_ALBERT_LAYER + "ffn.", INTERNAL_LAYER + "intermediate.dense."),
        (_ALBERT_LAYER + "ffn_output.", INTERNAL_LAYER + "output.dense."),
        (_ALBERT_LAYER + "full_layer_layer_norm.", INTERNAL_LAYER + "output.LayerNorm."),
        ("bert.pooler.", "bert.pooler.dense."),
        ("predictions.dense.", "cls.predictions.transform.dense."),
        ("predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("predictions.bias", "cls.predictions.bias"),
        ("sop_classifier.classifier.", "cls.seq_relationship."),
    ),
    dropped=(r"^predictions\.decoder\.(weight|bias)$",),
    # ALBERT v2's: one shared layer group, GELU (tanh), no dropout; E = 128 (less for the small sizes)
    preset=dict(
        num_hidden_groups=1, hidden_act="gelu_new", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        classifier_dropout=0.1,
    ),
    sized_preset=embedding_width,
    recipe=Recipe(masking="ngram"),
)
