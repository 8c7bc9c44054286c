"""BERT (Devlin et al., 2018): the encoder as it is, post-LN, learned absolute positions, two token types, a
pooler; pretrained with MLM and next-sentence prediction."""

from __future__ import annotations

from .distilbert import distilbert_student
from .family import Family

BERT = Family(model_type="bert", name="BERT", class_prefix="Bert", prefix="bert", student=distilbert_student)
