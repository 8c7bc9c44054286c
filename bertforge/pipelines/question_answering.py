"""Extractive question answering: the answer's text, probability and character span in the context.

Contexts longer than one window are cut into overlapping windows, and the answer span is chosen, by
`bertforge.data.qa_spans`: the same windows and the same rule as `bertforge predict --task qa`, so both give the same
answer from the same checkpoint. By default (`span_scoring="logits"`) spans compete on start logit + end logit
over all windows, from each window's `n_best` best starts and ends, and "no answer" wins when the [CLS] null logit
sum (the lowest over the windows) beats the best span's. The displayed `score` is, as in transformers' pipeline,
a probability: P(start) x P(end), softmax over the window's context tokens and [CLS] (for "no answer", that of
[CLS], the lowest over the windows). `span_scoring="probabilities", n_best=None` ranks by that probability instead:
the search transformers' question-answering pipeline used (v4; v5 dropped the pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from ..core.errors import BertforgeError
from ..model import BertForQuestionAnswering, BertPreTrainedModel
from ..data.qa_spans import NULL_ANSWER_KEY, Question, check_scoring, decode_spans, encode_qa
from .base import Feature, Pipeline
from .classification import _HEADLESS_HINT, _check_architecture
from ..model.attention import PackedBatch

DEFAULT_MAX_LENGTH = 384


class QuestionAnsweringPipeline(Pipeline):
    """`pipeline("question-answering", model=DIR)`: {"question", "context"} or (question, context) →
    {"answer", "score", "start", "end"} (a list of `top_k` such dicts if top_k > 1); a list → a list of results.

    Args:
        top_k: answers per question (default 1).
        max_answer_len: longest answer in tokens (default 15).
        doc_stride: tokens shared by consecutive windows of a long context (default 128).
        max_question_len: longer questions are cut to this many tokens (default 64).
        handle_impossible_answer: may answer "" (start = end = 0) when the [CLS] "no answer" score beats the spans
            (default: if the checkpoint was fine-tuned to, `version_2_with_negative` in its config.json).
        max_length: tokens per window (default 384, or the model's limit if smaller).
        span_scoring: "logits" (default; start + end logit, as `bertforge predict --task qa`) or "probabilities"
            (P(start) x P(end) per window) ranks the spans and decides "no answer".
        n_best: spans start and end among each window's n_best best tokens (default 20, as `bertforge predict`;
            None: any token).
    """

    task = "question-answering"
    input_description = 'a {"question", "context"} dict or a (question, context) tuple'
    model_class = BertForQuestionAnswering

    def __init__(
        self,
        model: Any,
        *,
        top_k: int = 1,
        max_answer_len: int = 15,
        doc_stride: int = 128,
        max_question_len: int = 64,
        handle_impossible_answer: bool | None = None,
        max_length: int | None = None,
        span_scoring: str = "logits",
        n_best: int | None = 20,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, max_length=max_length, **kwargs)
        if max_length is None:
            self.max_length = min(self.max_length, DEFAULT_MAX_LENGTH)
        for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len),
                            ("max_question_len", max_question_len), ("doc_stride", doc_stride + 1),
                            ("n_best", 1 if n_best is None else n_best)):
            if not isinstance(value, int) or value < 1:
                raise BertforgeError(f"question-answering: {name} must be a positive integer, got {value!r}")
        self.top_k = top_k
        self.max_answer_len = max_answer_len
        self.doc_stride = min(doc_stride, self.max_length // 2)
        self.max_question_len = max_question_len
        if handle_impossible_answer is None:
            handle_impossible_answer = bool(self.model.config.extra.get(NULL_ANSWER_KEY, False))
        self.handle_impossible_answer = handle_impossible_answer
        check_scoring(span_scoring)
        self.span_scoring = span_scoring
        self.n_best = n_best

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        _check_architecture(model, source, "BertForQuestionAnswering", self.task)
        if self.missing(model, "qa_outputs."):
            raise BertforgeError(
                f"{source} has no question-answering head (qa_outputs.* is not in the checkpoint): "
                + _HEADLESS_HINT.format(task="qa")
            )

    @staticmethod
    def split(item: Any) -> tuple[Any, Any]:
        """(question, context) of an input."""
        if isinstance(item, Mapping):
            return item.get("question"), item.get("context")
        if isinstance(item, tuple) and len(item) == 2:
            return item
        return None, None

    def is_single(self, inputs: Any) -> bool:
        return isinstance(inputs, Mapping) or (isinstance(inputs, tuple) and len(inputs) == 2)

    def check_input(self, item: Any, index: int) -> None:
        question, context = self.split(item)
        if not isinstance(question, str) or not isinstance(context, str):
            raise BertforgeError(
                f'question-answering: input {index} must be a {{"question", "context"}} dict or a (question, context) '
                f"tuple of strings, got {item!r:.80}"
            )
        if not question.strip():
            raise BertforgeError(f"question-answering: input {index} has an empty question")
        if not context.strip():
            raise BertforgeError(f"question-answering: input {index} has an empty context")

    def featurize(self, inputs: list[Any]) -> tuple[list[Feature], int]:
        examples = [Question(*self.split(item)) for item in inputs]
        encoded, windows = encode_qa(
            self.tokenizer, examples, self.max_length, self.doc_stride, self.max_question_len, with_targets=False
        )
        features = [
            Feature(window.example_index, f["input_ids"], f["token_type_ids"], window)
            for f, window in zip(encoded, windows)
        ]
        return features, 0  # long contexts are windowed, not truncated

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        model: BertForQuestionAnswering = self.model  # type: ignore[assignment]
        logits = model.span_logits(hidden).float().cpu()  # [T, 2]: start, end
        return [x.numpy() for x in logits.split(batch.lengths)]  # per window [len, 2]

    def postprocess(self, item: Any, outputs: list[np.ndarray], features: list[Feature]) -> Any:
        _, context = self.split(item)
        decoded = decode_spans(
            [(feature.extra, logits[:, 0], logits[:, 1]) for logits, feature in zip(outputs, features)],
            n_best=self.n_best, max_answer_length=self.max_answer_len, top_k=self.top_k, scoring=self.span_scoring,
        )
        answers = [{"score": span.probability, "start": span.start, "end": span.end,
                    "answer": context[span.start : span.end]} for span in decoded.spans]
        if self.handle_impossible_answer:
            answers.insert(decoded.null_rank(), {"score": decoded.null_probability, "start": 0, "end": 0, "answer": ""})
        elif not answers:  # no valid span at all
            answers.append({"score": 0.0, "start": 0, "end": 0, "answer": ""})
        return answers[0] if self.top_k == 1 else answers[: self.top_k]

    def __call__(self, inputs: Any = None, *, question: Any = None, context: Any = None) -> Any:
        """`pipe({"question": q, "context": c})`, `pipe((q, c))`, a list of either, or
        `pipe(question=q, context=c)` (strings, or equally long lists of strings)."""
        if inputs is None:
            if question is None or context is None:
                raise BertforgeError("question-answering: give inputs, or both question= and context=")
            if isinstance(question, str) and isinstance(context, str):
                inputs = {"question": question, "context": context}
            elif isinstance(question, list) and isinstance(context, list) and len(question) == len(context):
                inputs = [{"question": q, "context": c} for q, c in zip(question, context)]
            else:
                raise BertforgeError("question-answering: question= and context= must be two strings or two lists "
                                     "of the same length")
        return super().__call__(inputs)
