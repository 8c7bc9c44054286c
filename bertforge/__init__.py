"""bertforge: a complete, fast, readable BERT — pretrain it, fine-tune it, use it."""

from .model.auto import *  # noqa: F403 (AutoConfig, AutoModel, AutoModelFor...: auto.__all__)
from .model.auto import __all__ as _AUTO
from .model.config import BertConfig
from .core.errors import BertforgeError
from .model import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: importing the model does not pull in the tokenizer stack
    if name == "Tokenizer":
        from .tokenizer import Tokenizer

        return Tokenizer
    if name == "pipeline":
        from .pipelines import pipeline

        return pipeline
    raise AttributeError(f"module 'bertforge' has no attribute {name!r}")


__all__ = [
    *_AUTO,
    "BertConfig",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForNextSentencePrediction",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertforgeError",
    "Tokenizer",  # noqa: F405 (lazy: the module's __getattr__)
    "pipeline",  # noqa: F405
]
