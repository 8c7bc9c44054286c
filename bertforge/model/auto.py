"""`AutoConfig` and `AutoModel*`: one entry point per task for every family member.

There is one encoder, so there is one class per task (`BertForMaskedLM`, ...); the family is the config's
`model_type`. An Auto class reads `config.json`, checks that the family is supported and has the task, and builds
that class: `AutoModelForMaskedLM.from_pretrained("roberta-dir/")` is a `BertForMaskedLM` running RoBERTa's parts,
which `save_pretrained` writes back under RoBERTa's names (`RobertaForMaskedLM` in `config.json`).

    >>> model = AutoModelForSequenceClassification.from_pretrained("distilbert-dir/", num_labels=3)
    >>> model = AutoModelForMaskedLM.from_config(BertConfig.preset("albert-tiny", vocab_size=8000))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .checkpoint import load_pretrained
from .config import BertConfig
from . import (
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForMultipleChoice,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    BertPreTrainedModel,
)
from .rtd import BertForReplacedTokenDetection

#: the internal classes a family's `ForPreTraining` may be besides BERT's (`Family.class_names`: ELECTRA's discriminator)
PRETRAINING_CLASSES: dict[str, type[BertPreTrainedModel]] = {BertForReplacedTokenDetection.__name__:
                                                              BertForReplacedTokenDetection}


class AutoConfig:
    """`from_pretrained(dir, **overrides)`: the config of any supported family; `for_model(model_type, **fields)`."""

    @staticmethod
    def from_pretrained(path: str | Path, **overrides: Any) -> BertConfig:
        return BertConfig.from_pretrained(path, **overrides)

    @staticmethod
    def for_model(model_type: str, **fields: Any) -> BertConfig:
        """A config of `model_type` with `transformers`' defaults for that family, `fields` changed."""
        return BertConfig.from_dict({"model_type": model_type, **fields}, source=f"{model_type} config")


class _AutoModel:
    task_class: type[BertPreTrainedModel]

    @classmethod
    def model_class(cls, config: BertConfig) -> type[BertPreTrainedModel]:
        return cls.task_class

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> Any:
        """The model of the checkpoint directory `path`; keyword arguments change config fields (`num_labels=3`)
        or are the loader's (`ignore_mismatched_sizes`, `quiet`)."""
        loader_options = {k: overrides.pop(k) for k in ("ignore_mismatched_sizes", "quiet") if k in overrides}
        config = BertConfig.from_pretrained(path, **overrides)  # the family decides the class
        return load_pretrained(cls.model_class(config), path, **loader_options, **overrides)

    @classmethod
    def from_config(cls, config: BertConfig) -> Any:
        """A new, randomly initialised model of `config`'s family."""
        return cls.model_class(config)(config)


class AutoModel(_AutoModel):
    task_class = BertModel


class AutoModelForPreTraining(_AutoModel):
    """MLM and the family's sentence objective (BERT: NSP, ALBERT: SOP); MLM alone for RoBERTa and DistilBERT; the
    class the family's `transformers` ForPreTraining is where it names another (ELECTRA's: the discriminator)."""

    @classmethod
    def model_class(cls, config: BertConfig) -> type[BertPreTrainedModel]:
        member = config.family
        named = member.internal_architecture(member.class_prefix + "ForPreTraining")
        if named in PRETRAINING_CLASSES:
            return PRETRAINING_CLASSES[named]
        return BertForPreTraining if member.sentence_head else BertForMaskedLM


class AutoModelForMaskedLM(_AutoModel):
    task_class = BertForMaskedLM


class AutoModelForSequenceClassification(_AutoModel):
    task_class = BertForSequenceClassification


class AutoModelForMultipleChoice(_AutoModel):
    task_class = BertForMultipleChoice


class AutoModelForTokenClassification(_AutoModel):
    task_class = BertForTokenClassification


class AutoModelForQuestionAnswering(_AutoModel):
    task_class = BertForQuestionAnswering


__all__ = [
    "AutoConfig",
    "AutoModel",
    "AutoModelForMaskedLM",
    "AutoModelForMultipleChoice",
    "AutoModelForPreTraining",
    "AutoModelForQuestionAnswering",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
]
