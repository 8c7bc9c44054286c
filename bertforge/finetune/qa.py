"""Extractive QA: contexts cut into overlapping windows, answers mapped to token spans and back to characters.

A window is `[CLS] question [SEP] context[a:b] [SEP]` (segment ids 0 for the question part, 1 for the context
part). A context longer than one window is covered by several, each starting `window - doc_stride` tokens after
the previous one, so consecutive windows share `doc_stride` tokens (the meaning `transformers`' `stride` has).

Training targets are the answer's first and last token in a window that holds the whole answer, and the [CLS]
position (0) in a window that does not, or for an unanswerable SQuAD 2.0 question. At prediction time every
window proposes its `n_best` best starts and ends; the best valid span over all windows wins, unless (for a model
that may say "no answer") the [CLS] "null" score beats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BertforgeError
from .data import QAExample
from .features import Feature


@dataclass
class Window:
    """Where a feature comes from: its example, and the character span in the context of each of its tokens
    (None for [CLS], question tokens and [SEP])."""

    example_index: int
    offsets: list[tuple[int, int] | None]


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


def answer_token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """The first and last context token overlapping characters [char_start, char_end), or None if none does."""
    first = next((i for i, (_, end) in enumerate(offsets) if end > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or first > last:
        return None
    return first, last


def encode_qa(
    tokenizer: Any,
    examples: Sequence[QAExample],
    max_length: int,
    doc_stride: int,
    max_query_length: int,
    with_targets: bool,
) -> tuple[list[Feature], list[Window]]:
    """The windows of every example, as features (with start/end targets when `with_targets`) and their origin."""
    questions = tokenizer([e.question for e in examples], add_special_tokens=False)["input_ids"]
    contexts = sorted({e.context for e in examples})
    encoded = tokenizer(contexts, add_special_tokens=False, return_offsets_mapping=True)
    context_tokens = {c: (encoded["input_ids"][i], encoded["offset_mapping"][i]) for i, c in enumerate(contexts)}
    cls_id, sep_id = tokenizer.cls_token_id, tokenizer.sep_token_id
    features: list[Feature] = []
    windows: list[Window] = []
    for index, example in enumerate(examples):
        question = questions[index][:max_query_length]
        room = max_length - len(question) - 3  # context tokens per window: minus [CLS] and two [SEP]
        if room <= doc_stride:
            raise BertforgeError(
                f"--max-length {max_length} leaves {room} context tokens per window after a {len(question)}-token "
                f"question; it must exceed --doc-stride {doc_stride}"
            )
        ids, offsets = context_tokens[example.context]
        answer_span = None
        if with_targets and example.answers:
            text, start = example.answers[0]
            answer_span = answer_token_span(offsets, start, start + len(text))
        prefix = [cls_id, *question, sep_id]
        window_start = 0
        while True:
            window_end = min(window_start + room, len(ids))
            feature: Feature = {
                "input_ids": prefix + ids[window_start:window_end] + [sep_id],
                "token_type_ids": [0] * len(prefix) + [1] * (window_end - window_start + 1),
            }
            if with_targets:
                target = (0, 0)
                if answer_span and window_start <= answer_span[0] and answer_span[1] < window_end:
                    shift = len(prefix) - window_start
                    target = (answer_span[0] + shift, answer_span[1] + shift)
                feature["start_positions"], feature["end_positions"] = target
            features.append(feature)
            windows.append(Window(index, [None] * len(prefix) + list(offsets[window_start:window_end]) + [None]))
            if window_end >= len(ids):
                break
            window_start += room - doc_stride
    return features, windows


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
    best: list[tuple[float, int, int] | None] = [None] * len(examples)  # (score, char start, char end)
    null = [float("inf")] * len(examples)
    for window, starts, ends in zip(windows, start_logits, end_logits):
        i = window.example_index
        null[i] = min(null[i], float(starts[0] + ends[0]))
        top_starts = np.argsort(starts)[::-1][:n_best]
        top_ends = np.argsort(ends)[::-1][:n_best]
        for s in top_starts:
            if window.offsets[s] is None:
                continue
            for e in top_ends:
                if window.offsets[e] is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(starts[s] + ends[e])
                if best[i] is None or score > best[i][0]:
                    best[i] = (score, window.offsets[s][0], window.offsets[e][1])
    answers = []
    for example, candidate, null_score in zip(examples, best, null):
        span_score, start, end = candidate if candidate is not None else (float("-inf"), -1, -1)
        span_text = example.context[start:end] if candidate is not None else ""
        if candidate is None or (allow_null and null_score > span_score + null_threshold):
            answers.append(Answer("", -1, -1, null_score, null_score, span_text, span_score))
        else:
            answers.append(Answer(span_text, start, end, span_score, null_score, span_text, span_score))
    return answers
