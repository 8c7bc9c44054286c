"""Multiple choice: score each choice of a context with a `BertForMultipleChoice` and pick the likeliest.

    >>> choose = bertforge.pipeline("multiple-choice", model="runs/swag/model")
    >>> choose("john lives in paris .", ["john visited paris", "john visited london"])
    {'label': 0, 'score': 0.97..., 'scores': [0.97..., 0.02...]}

Each choice is the pair [CLS] context [SEP] choice [SEP] (as `finetune --task multiple-choice` encodes it), one
logit each through the model's head; the scores are the softmax over an input's choices, what `transformers`'
AutoModelForMultipleChoice's logits give. The pairs of all inputs are packed into the same length-sorted batches,
so inputs may have different numbers of choices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from torch import Tensor

from ..core.errors import BertforgeError
from ..model import BertForMultipleChoice, BertPreTrainedModel
from ..model.attention import PackedBatch
from .base import Feature, Pipeline


class MultipleChoicePipeline(Pipeline):
    """`pipeline("multiple-choice", model=DIR)`: `choose(context, choices)` → {"label" (the likeliest choice's
    index), "score" (its probability), "scores" (every choice's)}; a list of (context, choices) tuples or
    {"context", "choices"} dicts → a list of results.

    Args: see `Pipeline`."""

    task = "multiple-choice"
    call_arguments = ("choices",)
    input_description = 'a (context, choices) tuple or a {"context", "choices"} dict'
    model_class = BertForMultipleChoice

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        missing = [prefix for prefix in model.head_prefixes() if self.missing(model, prefix)]
        if missing:
            raise BertforgeError(f"{source} has no multiple-choice head ({missing[0]}* is not in the checkpoint): "
                                 "fine-tune one with `bertforge finetune --task multiple-choice --model DIR --train "
                                 "FILE --dev FILE --out DIR`")

    @staticmethod
    def split(item: Any) -> tuple[Any, Any]:
        """(context, choices) of an input."""
        if isinstance(item, Mapping):
            return item.get("context"), item.get("choices")
        return item if isinstance(item, tuple) and len(item) == 2 else (item, None)

    def is_single(self, inputs: Any) -> bool:
        return isinstance(inputs, Mapping) or (isinstance(inputs, tuple) and len(inputs) == 2)

    def check_input(self, item: Any, index: int) -> None:
        context, choices = self.split(item)
        if (not isinstance(context, str) or not isinstance(choices, (list, tuple)) or len(choices) < 2
                or not all(isinstance(c, str) for c in choices)):
            raise BertforgeError(f"{self.task}: input {index} must be {self.input_description}: a string and a list "
                                 f"of at least two strings, got {item!r:.80}")

    def featurize(self, inputs: list[Any]) -> tuple[list[Feature], int]:
        split = [self.split(item) for item in inputs]
        enc, truncated = self.encode([c for c, choices in split for _ in choices],
                                     [choice for _, choices in split for choice in choices])
        owners = [i for i, (_, choices) in enumerate(split) for _ in choices]  # each pair's input, choice by choice
        return [Feature(i, ids, types) for i, ids, types in zip(owners, enc["input_ids"], enc["token_type_ids"])], truncated

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[float]:
        model: BertForMultipleChoice = self.model  # type: ignore[assignment]
        return model.packed_logits(hidden, batch).float().view(-1).cpu().tolist()  # one logit per pair

    def postprocess(self, item: Any, outputs: Sequence[float], features: list[Feature]) -> dict[str, Any]:
        logits = np.asarray(outputs, dtype=np.float64)  # the input's choices, in order
        scores = np.exp(logits - logits.max())
        scores /= scores.sum()
        best = int(scores.argmax())
        return {"label": best, "score": float(scores[best]), "scores": [float(s) for s in scores]}

    def __call__(self, inputs: Any, choices: Any = None, **options: Any) -> Any:
        """`choose(context, choices)`, or one input or a list of inputs (see the class). `options`: settings for
        this call only (`call_options`)."""
        if choices is not None:
            return super().__call__((inputs, choices), **options)
        return super().__call__(inputs, **options)
