"""RoBERTa (Liu et al., 2019) and XLM-RoBERTa (Conneau et al., 2019): BERT's encoder with positions counted
after the padding id, one token type, a first-token sequence head and an MLM head with GELU; MLM only."""

from __future__ import annotations

from typing import Any

from .distilbert import distilbert_student
from .family import BertParts, Family, Recipe

_ROBERTA_KEYS = (
    ("lm_head.dense.", "cls.predictions.transform.dense."),
    ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
    ("lm_head.bias", "cls.predictions.bias"),
)
_ROBERTA_PARTS: dict[str, Any] = dict(
    prefix="roberta",
    parts=BertParts(positions="after-padding", sequence_head="first-token", mlm_act="gelu", choice_head="pooler"),
    sentence_head=None,
    keys=_ROBERTA_KEYS,
    dropped=(r"^lm_head\.decoder\.(weight|bias)$",),
    # roberta-base's: 512 positions after the padding offset, one token type, eps 1e-5
    preset=dict(max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5, pad_token_id=1),
    recipe=Recipe(adam_beta2=0.98),  # the RoBERTa paper's, for stability with large batches
    student=distilbert_student,  # distilled into a DistilBERT (its positions' offset folded in)
)
# `transformers.RobertaConfig`'s defaults (roberta-base itself sets 514 positions, 1 token type, eps 1e-5)
_ROBERTA_DEFAULTS: dict[str, Any] = dict(vocab_size=50265, pad_token_id=1)

ROBERTA = Family(
    model_type="roberta", name="RoBERTa", class_prefix="Roberta", defaults=_ROBERTA_DEFAULTS, **_ROBERTA_PARTS
)
XLM_ROBERTA = Family(
    model_type="xlm-roberta",
    name="XLM-RoBERTa",
    class_prefix="XLMRoberta",
    defaults=dict(_ROBERTA_DEFAULTS, vocab_size=30522),
    **_ROBERTA_PARTS,
)
