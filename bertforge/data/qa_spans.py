"""Extractive QA shared by fine-tuning (`bertforge predict|evaluate --task qa`) and the question-answering
pipeline: contexts cut into overlapping windows, and the ONE rule that picks the answer span from the windows'
start and end logits, so both give the same answer from the same checkpoint.

Windows. A window is `[CLS] question [SEP] context[a:b] [SEP]` (segment ids 0 for the question part, 1 for the
context part). A context longer than one window is covered by several, each starting `window - doc_stride` tokens
after the previous one, so consecutive windows share `doc_stride` tokens (the meaning `transformers`' `stride` has).

Spans. In each window a span is a candidate when both ends are context tokens, end >= start, it spans at most
`max_answer_length` tokens, and (with `n_best`) its start is among the window's `n_best` highest start logits and
its end among the `n_best` highest end logits (as BERT's `run_squad.py` and transformers' `run_qa` do). The
candidates of all windows compete on one score, by default (`scoring="logits"`) start logit + end logit, the rule
of SQuAD fine-tuning evaluation. The "no answer" (null) score is that of [CLS] as both start and end, the lowest
over the windows; a model that may say "no answer" says it when the null score beats the best span's.

`scoring="probabilities"` ranks by P(start) x P(end) instead, with start and end logits turned into probabilities
by a softmax over each window's context tokens and [CLS] (transformers' v4 question-answering pipeline; with
`n_best=None` it is that pipeline's search exactly). Within one window both rules order spans alike (a softmax
subtracts one constant per window from the logits); they can differ across windows and on the null decision.
Every span carries both scores, so a caller may *show* a probability while choosing by logits.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..core.errors import BertforgeError

#: config.json key: the model was trained to say "no answer" (SQuAD 2.0), so its null score may win.
NULL_ANSWER_KEY = "version_2_with_negative"
#: How candidate spans are ranked: start + end logit, or P(start) x P(end) within their window.
SCORINGS = ("logits", "probabilities")


class QAInput(Protocol):
    """What windowing needs of a question (`bertforge.finetune.squad.QAExample` is one)."""

    @property
    def question(self) -> str: ...
    @property
    def context(self) -> str: ...
    @property
    def answers(self) -> Sequence[tuple[str, int]]: ...


@dataclass(frozen=True)
class Question:
    """A question and its context with no gold answers: what the pipeline windows."""

    question: str
    context: str
    answers: tuple[tuple[str, int], ...] = ()


@dataclass
class Window:
    """Where a feature comes from: its example, and the character span in the context of each of its tokens
    (None for [CLS], question tokens and [SEP])."""

    example_index: int
    offsets: list[tuple[int, int] | None]


def answer_token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """The first and last context token overlapping characters [char_start, char_end), or None if none does."""
    first = next((i for i, (_, end) in enumerate(offsets) if end > char_start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < char_end), None)
    if first is None or last is None or first > last:
        return None
    return first, last


def encode_qa(
    tokenizer: Any,
    examples: Sequence[QAInput],
    max_length: int,
    doc_stride: int,
    max_query_length: int,
    with_targets: bool,
) -> tuple[list[dict[str, Any]], list[Window]]:
    """The windows of every example, as features (with start/end targets when `with_targets`) and their origin.

    Training targets are the answer's first and last token in a window that holds the whole answer, and the [CLS]
    position (0) in a window that does not, or for an unanswerable question.
    """
    questions = tokenizer([e.question for e in examples], add_special_tokens=False)["input_ids"]
    contexts = sorted({e.context for e in examples})
    encoded = tokenizer(contexts, add_special_tokens=False, return_offsets_mapping=True)
    context_tokens = {c: (encoded["input_ids"][i], encoded["offset_mapping"][i]) for i, c in enumerate(contexts)}
    pieces = [p.piece for p in tokenizer.kind.pieces(pair=True)]
    suffix = len(pieces) - pieces.index("B") - 1  # special tokens after the context: [SEP], or RoBERTa's </s>
    features: list[dict[str, Any]] = []
    windows: list[Window] = []
    for index, example in enumerate(examples):
        question = questions[index][:max_query_length]
        room = max_length - len(question) - tokenizer.num_special_tokens_to_add(pair=True)  # context tokens per window
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
        window_start = 0
        while True:
            window_end = min(window_start + room, len(ids))
            input_ids, type_ids = tokenizer.build_inputs(question, ids[window_start:window_end])  # the family's template
            prefix = len(input_ids) - (window_end - window_start) - suffix  # tokens before the context
            feature: dict[str, Any] = {"input_ids": input_ids, "token_type_ids": type_ids}
            if with_targets:
                target = (0, 0)
                if answer_span and window_start <= answer_span[0] and answer_span[1] < window_end:
                    shift = prefix - window_start
                    target = (answer_span[0] + shift, answer_span[1] + shift)
                feature["start_positions"], feature["end_positions"] = target
            features.append(feature)
            windows.append(Window(index, [None] * prefix + list(offsets[window_start:window_end]) + [None] * suffix))
            if window_end >= len(ids):
                break
            window_start += room - doc_stride
    return features, windows


# ---------------------------------------------------------------------------------------------------- spans


@dataclass(frozen=True)
class Span:
    """A candidate answer: its character span in the context and both of its scores (from the window where it
    ranks best)."""

    start: int
    end: int
    logit: float  # start logit + end logit
    probability: float  # P(start) x P(end), softmax over the window's context tokens and [CLS]

    def score(self, scoring: str) -> float:
        return self.logit if scoring == "logits" else self.probability


@dataclass
class Decoded:
    """One question's candidate spans over all its windows, and its "no answer" scores."""

    spans: list[Span]  # distinct character spans, best first by `scoring`, at most top_k
    null_logit: float  # [CLS] start + end logit, the lowest over the windows
    null_probability: float  # P(start = [CLS]) x P(end = [CLS]), the lowest over the windows
    scoring: str

    @property
    def null_score(self) -> float:
        return self.null_logit if self.scoring == "logits" else self.null_probability

    def null_rank(self, threshold: float = 0.0) -> int:
        """Where "no answer" ranks among the spans: before the first span whose score it exceeds by more than
        `threshold` (0 means it wins)."""
        return next((i for i, s in enumerate(self.spans) if self.null_score > s.score(self.scoring) + threshold),
                    len(self.spans))

    def null_wins(self, threshold: float = 0.0) -> bool:
        """Whether a model that may say "no answer" says it: no span is valid, or the null score exceeds the best
        span's by more than `threshold`."""
        return self.null_rank(threshold) == 0


def check_scoring(scoring: str) -> None:
    if scoring not in SCORINGS:
        raise BertforgeError(f"span scoring must be one of {', '.join(SCORINGS)}, got {scoring!r}")


def _softmax(logits: np.ndarray, keep: np.ndarray) -> np.ndarray:
    x = np.where(keep, logits.astype(np.float64), -np.inf)
    p = np.exp(x - x.max())
    return p / p.sum()


def window_spans(
    window: Window,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    *,
    n_best: int | None,
    max_answer_length: int,
    top_k: int,
    scoring: str,
) -> tuple[list[Span], float, float]:
    """The `top_k` best candidate spans of one window (best first) and its null logit and probability."""
    starts, ends = np.asarray(start_logits), np.asarray(end_logits)
    context = np.array([offset is not None for offset in window.offsets])
    in_softmax = context.copy()
    in_softmax[0] = True
    p_start, p_end = _softmax(starts, in_softmax), _softmax(ends, in_softmax)
    null_logit, null_probability = float(starts[0] + ends[0]), float(p_start[0] * p_end[0])
    can_start, can_end = context.copy(), context.copy()
    if n_best is not None:
        for can, logits in ((can_start, starts), (can_end, ends)):
            top = np.zeros(len(logits), dtype=bool)
            top[np.argsort(logits)[::-1][:n_best]] = True
            can &= top
    s_index, e_index = np.flatnonzero(can_start), np.flatnonzero(can_end)
    length = e_index[None, :] - s_index[:, None]  # [starts, ends]: end - start
    valid = (length >= 0) & (length < max_answer_length)
    if scoring == "logits":
        rank = starts[s_index][:, None] + ends[e_index][None, :]
    else:
        rank = np.outer(p_start[s_index], p_end[e_index])
        valid &= rank > 0  # an underflowed probability ranks nothing
    flat = np.where(valid, rank, -np.inf).ravel()
    k = min(top_k, int(valid.sum()))
    if k == 0:
        return [], null_logit, null_probability
    best = np.argpartition(-flat, k - 1)[:k]
    best = best[np.argsort(-flat[best], kind="stable")]
    spans = []
    for i in best:
        s, e = int(s_index[i // len(e_index)]), int(e_index[i % len(e_index)])
        spans.append(Span(window.offsets[s][0], window.offsets[e][1],  # type: ignore[index]  # context tokens: offsets
                          float(starts[s] + ends[e]), float(p_start[s] * p_end[e])))
    return spans, null_logit, null_probability


def decode_spans(
    windows: Iterable[tuple[Window, np.ndarray, np.ndarray]],
    *,
    n_best: int | None = 20,
    max_answer_length: int = 30,
    top_k: int = 1,
    scoring: str = "logits",
) -> Decoded:
    """One question's best `top_k` answer spans over its windows ((window, start logits, end logits), one [length]
    array each), and its null scores. A character span found in several windows keeps its best score."""
    check_scoring(scoring)
    best: dict[tuple[int, int], Span] = {}
    null_logit = null_probability = float("inf")
    for window, starts, ends in windows:
        spans, window_null_logit, window_null_probability = window_spans(
            window, starts, ends, n_best=n_best, max_answer_length=max_answer_length, top_k=top_k, scoring=scoring
        )
        null_logit = min(null_logit, window_null_logit)
        null_probability = min(null_probability, window_null_probability)
        for span in spans:
            key = (span.start, span.end)
            if key not in best or span.score(scoring) > best[key].score(scoring):
                best[key] = span
    ranked = sorted(best.values(), key=lambda span: -span.score(scoring))
    return Decoded(ranked[:top_k], null_logit, null_probability, scoring)
