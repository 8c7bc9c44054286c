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
        self.set_top_k(top_k)
        self.set_max_answer_len(max_answer_len)
        self.set_doc_stride(doc_stride)
        self.set_max_question_len(max_question_len)
        self.set_handle_impossible_answer(handle_impossible_answer)
        self.set_span_scoring(span_scoring)
        self.set_n_best(n_best)

    # transformers' v4 options (v5 has no question-answering pipeline); long contexts are windowed, not truncated
    call_options = ("batch_size", "max_batch_tokens", "max_length", "progress", "top_k", "max_answer_len",
                    "doc_stride", "max_question_len", "handle_impossible_answer", "span_scoring", "n_best")
    refused_options = {
        **Pipeline.refused_options,
        "topk": "it is called top_k",
        "max_seq_len": "the tokens per window are max_length=N here",
        "align_to_words": "answers are token spans, given as the characters of their tokens",
        "truncation": "a long context is cut into overlapping windows (doc_stride), never truncated",
    }
    call_arguments = ("question", "context")

    def set_top_k(self, top_k: Any) -> None:
        self.top_k = self.check_positive("top_k", top_k)

    def set_max_answer_len(self, max_answer_len: Any) -> None:
        self.max_answer_len = self.check_positive("max_answer_len", max_answer_len)

    def set_doc_stride(self, doc_stride: Any) -> None:
        """Tokens shared by consecutive windows (at most half a window: `window_stride`)."""
        if isinstance(doc_stride, bool) or not isinstance(doc_stride, int) or doc_stride < 0:
            raise BertforgeError(f"question-answering: doc_stride must be a non-negative integer, got {doc_stride!r}")
        self.doc_stride = doc_stride

    def window_stride(self) -> int:
        """The tokens consecutive windows share: doc_stride, at most half of max_length."""
        return min(self.doc_stride, self.max_length // 2)

    def set_max_question_len(self, max_question_len: Any) -> None:
        self.max_question_len = self.check_positive("max_question_len", max_question_len)

    def set_handle_impossible_answer(self, handle_impossible_answer: Any) -> None:
        """Whether "" may be the answer; None: if the checkpoint was fine-tuned to (`version_2_with_negative`)."""
        if handle_impossible_answer is None:
            handle_impossible_answer = bool(self.model.config.extra.get(NULL_ANSWER_KEY, False))
        if not isinstance(handle_impossible_answer, bool):
            raise BertforgeError("question-answering: handle_impossible_answer must be True, False or None, got "
                                 f"{handle_impossible_answer!r}")
        self.handle_impossible_answer = handle_impossible_answer

    def set_span_scoring(self, span_scoring: Any) -> None:
        check_scoring(span_scoring)
        self.span_scoring = span_scoring

    def set_n_best(self, n_best: Any) -> None:
        self.n_best = None if n_best is None else self.check_positive("n_best", n_best)

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
            self.tokenizer, examples, self.max_length, self.window_stride(), self.max_question_len, with_targets=False
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

    def __call__(self, inputs: Any = None, *, question: Any = None, context: Any = None, **options: Any) -> Any:
        """`pipe({"question": q, "context": c})`, `pipe((q, c))`, a list of either, or
        `pipe(question=q, context=c)` (strings, or equally long lists of strings). `options`: settings for this
        call only (`call_options`): `qa(inputs, top_k=3)`."""
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
        return super().__call__(inputs, **options)
