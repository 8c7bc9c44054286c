"""Extractive question answering: the answer's text, probability and character span in the context.

Contexts longer than one window are cut into overlapping windows by `bertforge.finetune.qa.encode_qa` (the same
windows fine-tuning and `bertforge predict` use). The span search is the one transformers' question-answering
pipeline used (v4; v5 dropped the pipeline): in each window, start and end logits become probabilities by a
softmax over the context tokens and [CLS]; a span's score is P(start) x P(end) with [CLS] excluded, end >= start
and at most `max_answer_len` tokens; the best spans of all windows compete on that score.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from ..errors import BertforgeError
from ..finetune.data import QAExample
from ..finetune.qa import Window, encode_qa
from ..model import BertForQuestionAnswering, BertPreTrainedModel
from .base import Feature, Pipeline
from .classification import _HEADLESS_HINT, _check_architecture
from ..attention import PackedBatch

DEFAULT_MAX_LENGTH = 384


def best_spans(
    start_logits: np.ndarray, end_logits: np.ndarray, allowed: np.ndarray, max_answer_len: int, top_k: int
) -> tuple[list[tuple[float, int, int]], float]:
    """The `top_k` best (score, start, end) token spans of one window, and its "no answer" score.

    Args:
        start_logits, end_logits: [n] for the window's tokens.
        allowed: [n] bool, True for tokens an answer may contain (the context).
    Position 0 ([CLS]) takes part in the softmax but not in spans; its P(start) x P(end) is the null score.
    """
    in_softmax = allowed.copy()
    in_softmax[0] = True
    probs = []
    for logits in (start_logits, end_logits):
        x = np.where(in_softmax, logits.astype(np.float64), -np.inf)
        p = np.exp(x - x.max())
        probs.append(p / p.sum())
    start, end = probs
    null = float(start[0] * end[0])
    start = np.where(allowed, start, 0.0)
    end = np.where(allowed, end, 0.0)
    start[0] = end[0] = 0.0
    scores = np.triu(np.tril(np.outer(start, end), max_answer_len - 1))  # [n, n]: end >= start, short enough
    flat = scores.ravel()
    k = min(top_k, int((flat > 0).sum()))
    if k == 0:
        return [], null
    best = np.argpartition(-flat, k - 1)[:k]
    best = best[np.argsort(-flat[best], kind="stable")]
    n = scores.shape[1]
    return [(float(flat[i]), int(i // n), int(i % n)) for i in best], null


class QuestionAnsweringPipeline(Pipeline):
    """`pipeline("question-answering", model=DIR)`: {"question", "context"} or (question, context) →
    {"answer", "score", "start", "end"} (a list of `top_k` such dicts if top_k > 1); a list → a list of results.

    Args:
        top_k: answers per question (default 1).
        max_answer_len: longest answer in tokens (default 15).
        doc_stride: tokens shared by consecutive windows of a long context (default 128).
        max_question_len: longer questions are cut to this many tokens (default 64).
        handle_impossible_answer: may answer "" (start = end = 0) when the [CLS] "no answer" score beats the spans.
        max_length: tokens per window (default 384, or the model's limit if smaller).
    """

    task = "question-answering"
    model_class = BertForQuestionAnswering

    def __init__(
        self,
        model: Any,
        *,
        top_k: int = 1,
        max_answer_len: int = 15,
        doc_stride: int = 128,
        max_question_len: int = 64,
        handle_impossible_answer: bool = False,
        max_length: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, max_length=max_length, **kwargs)
        if max_length is None:
            self.max_length = min(self.max_length, DEFAULT_MAX_LENGTH)
        for name, value in (("top_k", top_k), ("max_answer_len", max_answer_len),
                            ("max_question_len", max_question_len), ("doc_stride", doc_stride + 1)):
            if not isinstance(value, int) or value < 1:
                raise BertforgeError(f"question-answering: {name} must be a positive integer, got {value!r}")
        self.top_k = top_k
        self.max_answer_len = max_answer_len
        self.doc_stride = min(doc_stride, self.max_length // 2)
        self.max_question_len = max_question_len
        self.handle_impossible_answer = handle_impossible_answer

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
        examples = [QAExample(str(i), *self.split(item)) for i, item in enumerate(inputs)]
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
        logits = model.qa_outputs(hidden).float()  # [T, 2]: start, end
        return [x.numpy() for x in logits.split(batch.lengths)]  # per window [len, 2]

    def postprocess(self, item: Any, outputs: list[np.ndarray], features: list[Feature]) -> Any:
        _, context = self.split(item)
        candidates: dict[tuple[int, int], float] = {}  # character span -> best score over windows
        null = float("inf")
        for logits, feature in zip(outputs, features):
            window: Window = feature.extra
            allowed = np.array([offset is not None for offset in window.offsets])
            spans, window_null = best_spans(logits[:, 0], logits[:, 1], allowed, self.max_answer_len, self.top_k)
            null = min(null, window_null)
            for score, s, e in spans:
                key = (window.offsets[s][0], window.offsets[e][1])
                candidates[key] = max(score, candidates.get(key, 0.0))
        answers = [{"score": score, "start": start, "end": end, "answer": context[start:end]}
                   for (start, end), score in candidates.items()]
        if self.handle_impossible_answer:
            answers.append({"score": null, "start": 0, "end": 0, "answer": ""})
        elif not answers:  # no valid span at all (every context token has probability 0)
            answers.append({"score": 0.0, "start": 0, "end": 0, "answer": ""})
        answers.sort(key=lambda a: -a["score"])
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
