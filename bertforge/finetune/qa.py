"""Extractive QA for fine-tuning: SQuAD answers from the windows' logits.

The windows (`encode_qa`) and the span rule (`decode_spans`) live in `bertforge.data.qa_spans`, shared with the
question-answering pipeline so that `bertforge predict --task qa` and `pipeline("question-answering")` answer
alike. Here every example's best span is ranked by start + end logit (the rule of SQuAD evaluation), from its
windows' `n_best` best starts and ends; for a model that may say "no answer" the [CLS] "null" score can beat it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..data.qa_spans import Window, answer_token_span, decode_spans, encode_qa
from .squad import QAExample

__all__ = ["Answer", "Window", "answer_token_span", "best_answers", "encode_qa"]


@dataclass
class Answer:
    """A predicted answer: its text and character span in the context (empty text and -1 for "no answer")."""

    text: str
    start: int
    end: int
    score: float  # start + end logit of the chosen span (of [CLS] for "no answer")
    null_score: float  # start + end logit of [CLS], the lowest over the example's windows
    span_text: str  # the best non-empty answer, even where "no answer" won ("" when no span was valid)
    span_score: float  # its start + end logit (-inf when no span was valid)


def best_answers(
    examples: Sequence[QAExample],
    windows: Sequence[Window],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    n_best: int = 20,
    max_answer_length: int = 30,
    allow_null: bool = False,
    null_threshold: float = 0.0,
) -> list[Answer]:
    """The best answer of each example from its windows' logits (one [length] array per window).

    A span is valid when both ends are context tokens of one window, end >= start and it spans at most
    `max_answer_length` tokens; its score is start logit + end logit. With `allow_null`, "no answer" is chosen when
    the [CLS] score exceeds the best span's by more than `null_threshold` (or no span is valid).
    """
    by_example: list[list[tuple[Window, np.ndarray, np.ndarray]]] = [[] for _ in examples]
    for window, starts, ends in zip(windows, start_logits, end_logits):
        by_example[window.example_index].append((window, starts, ends))
    answers = []
    for example, example_windows in zip(examples, by_example):
        decoded = decode_spans(example_windows, n_best=n_best, max_answer_length=max_answer_length, scoring="logits")
        null_score = decoded.null_logit
        if not decoded.spans:
            answers.append(Answer("", -1, -1, null_score, null_score, "", float("-inf")))
            continue
        best = decoded.spans[0]
        span_text = example.context[best.start : best.end]
        if allow_null and decoded.null_wins(null_threshold):
            answers.append(Answer("", -1, -1, null_score, null_score, span_text, best.logit))
        else:
            answers.append(Answer(span_text, best.start, best.end, best.logit, null_score, span_text, best.logit))
    return answers
