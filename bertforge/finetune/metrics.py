"""Evaluation metrics, written from their definitions (no scikit-learn, scipy or seqeval needed).

* Classification: accuracy, F1 (binary and macro), Matthews correlation; multi-label: micro and macro F1, subset
  accuracy.
* Regression: Pearson and Spearman correlation, mean squared error.
* Token classification: entity-level precision / recall / F1, overall and per entity type, with the span rules of
  the CoNLL `conlleval` script (which `seqeval` follows in its default mode), so IOB1, IOB2 and IOBES tags all work.
* Extractive QA: Exact Match and F1 with the answer normalisation of the official SQuAD evaluation script
  (v1.1 and v2.0), reported in percent as that script does.

Classification and NER scores are fractions in [0, 1]; SQuAD scores are percentages in [0, 100].
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

# ---------------------------------------------------------------------------------------------------- classification


def accuracy(gold: Sequence[int], pred: Sequence[int]) -> float:
    """The fraction of positions where `pred` equals `gold`."""
    _check_lengths(gold, pred)
    return sum(g == p for g, p in zip(gold, pred)) / len(gold) if gold else 0.0


def precision_recall_f1(true_positives: int, predicted: int, actual: int) -> tuple[float, float, float]:
    """Precision, recall and F1 from counts; each is 0 where its denominator is 0."""
    precision = true_positives / predicted if predicted else 0.0
    recall = true_positives / actual if actual else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def f1_for_class(gold: Sequence[int], pred: Sequence[int], positive: int) -> float:
    """F1 of one class against all others (binary F1 when `positive` is the positive class)."""
    _check_lengths(gold, pred)
    tp = sum(g == positive and p == positive for g, p in zip(gold, pred))
    return precision_recall_f1(tp, sum(p == positive for p in pred), sum(g == positive for g in gold))[2]


def macro_f1(gold: Sequence[int], pred: Sequence[int]) -> float:
    """The unweighted mean of the per-class F1 over every class found in `gold` or `pred`."""
    classes = sorted(set(gold) | set(pred))
    return sum(f1_for_class(gold, pred, c) for c in classes) / len(classes) if classes else 0.0


def matthews_corrcoef(gold: Sequence[int], pred: Sequence[int]) -> float:
    """Matthews correlation coefficient, multi-class form (Gorodkin 2004); 0 when it is undefined.

    MCC = (c·s − Σₖ pₖ tₖ) / √((s² − Σₖ pₖ²)(s² − Σₖ tₖ²)) with s samples, c correct, pₖ / tₖ the number of times
    class k is predicted / true. For two classes this is the familiar (TP·TN − FP·FN) / √(...).
    """
    _check_lengths(gold, pred)
    s = len(gold)
    c = sum(g == p for g, p in zip(gold, pred))
    true_counts, pred_counts = Counter(gold), Counter(pred)
    classes = set(true_counts) | set(pred_counts)
    covariance = c * s - sum(pred_counts[k] * true_counts[k] for k in classes)
    pred_var = s * s - sum(n * n for n in pred_counts.values())
    true_var = s * s - sum(n * n for n in true_counts.values())
    if pred_var == 0 or true_var == 0:
        return 0.0
    return covariance / math.sqrt(pred_var * true_var)


def classification_metrics(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> dict[str, float]:
    """accuracy, f1 (positive class id 1; only with two labels), macro_f1 and mcc."""
    metrics = {"accuracy": accuracy(gold, pred)}
    if num_labels == 2:
        metrics["f1"] = f1_for_class(gold, pred, positive=1)
    metrics["macro_f1"] = macro_f1(gold, pred)
    metrics["mcc"] = matthews_corrcoef(gold, pred)
    return metrics


def multi_label_metrics(gold: Sequence[Iterable[int]], pred: Sequence[Iterable[int]], num_labels: int) -> dict[str, float]:
    """Multi-label scores from each example's label ids (gold and predicted sets): micro_f1 (true positives, predicted
    and actual labels counted over every label), macro_f1 (the mean of each of the `num_labels` labels' F1, 0 for a
    label never true nor predicted, as scikit-learn's `f1_score(average="macro")`) and subset_accuracy (the share
    of examples whose predicted set is exactly the gold one)."""
    _check_lengths(gold, pred)
    gold_sets, pred_sets = [set(g) for g in gold], [set(p) for p in pred]
    tp = [0] * num_labels
    predicted = [0] * num_labels
    actual = [0] * num_labels
    for g, p in zip(gold_sets, pred_sets):
        for label in g & p:
            tp[label] += 1
        for label in p:
            predicted[label] += 1
        for label in g:
            actual[label] += 1
    micro = precision_recall_f1(sum(tp), sum(predicted), sum(actual))[2]
    macro = sum(precision_recall_f1(tp[k], predicted[k], actual[k])[2] for k in range(num_labels)) / num_labels
    subset = sum(g == p for g, p in zip(gold_sets, pred_sets)) / len(gold_sets) if gold_sets else 0.0
    return {"micro_f1": micro, "macro_f1": macro, "subset_accuracy": subset}


# ---------------------------------------------------------------------------------------------------- regression


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; 0 when either side is constant (where it is undefined)."""
    _check_lengths(x, y)
    n = len(x)
    if n == 0:
        return 0.0
    mean_x, mean_y = sum(x) / n, sum(y) / n
    cov = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y))
    var_x = sum((a - mean_x) ** 2 for a in x)
    var_y = sum((b - mean_y) ** 2 for b in y)
    if var_x == 0 or var_y == 0:
        return 0.0
    return cov / math.sqrt(var_x * var_y)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span (the convention Spearman's rho uses)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    result = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1
        for k in range(i, j + 1):
            result[order[k]] = mean_rank
        i = j + 1
    return result


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson's r of the (tie-averaged) ranks."""
    return pearson(ranks(x), ranks(y))


def regression_metrics(gold: Sequence[float], pred: Sequence[float]) -> dict[str, float]:
    """pearson, spearman and mse."""
    _check_lengths(gold, pred)
    mse = sum((g - p) ** 2 for g, p in zip(gold, pred)) / len(gold) if gold else 0.0
    return {"pearson": pearson(gold, pred), "spearman": spearman(gold, pred), "mse": mse}


# ---------------------------------------------------------------------------------------------------- entities


def split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") from "B-PER", ("O", "") from "O"; a tag without a B/I/E/S prefix counts as inside its type."""
    if tag == "O":
        return "O", ""
    prefix, dash, kind = tag.partition("-")
    if dash and prefix in ("B", "I", "E", "S"):
        return prefix, kind
    return "I", tag


def _ends_chunk(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """Whether the chunk open at the previous tag ends before the current one (conlleval's endOfChunk)."""
    if prev in ("E", "S"):
        return True
    if prev in ("B", "I") and cur in ("B", "S", "O"):
        return True
    return prev != "O" and prev_type != cur_type


def _starts_chunk(prev: str, prev_type: str, cur: str, cur_type: str) -> bool:
    """Whether a chunk starts at the current tag (conlleval's startOfChunk)."""
    if cur in ("B", "S"):
        return True
    if prev in ("E", "S", "O") and cur in ("E", "I"):
        return True
    return cur != "O" and prev_type != cur_type


def entity_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one tagged sentence as (type, start, end) word spans, end exclusive.

    The rules are conlleval's, so both IOB1 ("I-PER I-PER B-PER": a B only separates two adjacent entities of one
    type) and IOB2 (every entity opens with B) give the intended spans, and an I-X after O or after another type
    opens a new entity instead of being dropped.
    """
    spans: list[tuple[str, int, int]] = []
    prev, prev_type = "O", ""
    start = -1
    for i, tag in enumerate([*tags, "O"]):  # a final O closes an entity still open
        cur, cur_type = split_tag(tag)
        if start >= 0 and _ends_chunk(prev, prev_type, cur, cur_type):
            spans.append((prev_type, start, i))
            start = -1
        if _starts_chunk(prev, prev_type, cur, cur_type):
            start = i
        prev, prev_type = cur, cur_type
    return spans


def entity_metrics(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, object]:
    """Entity-level micro precision / recall / F1 over sentences, per-type scores, and token accuracy.

    An entity counts as found only when the predicted span and type both match exactly. Returns
    {"precision", "recall", "f1", "accuracy", "per_type": {type: {"precision", "recall", "f1", "support"}}}.
    """
    _check_lengths(gold, pred)
    gold_set: set[tuple[int, str, int, int]] = set()
    pred_set: set[tuple[int, str, int, int]] = set()
    correct_tokens = total_tokens = 0
    for n, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(g)} gold tags but {len(p)} predicted")
        gold_set.update((n, *span) for span in entity_spans(g))
        pred_set.update((n, *span) for span in entity_spans(p))
        correct_tokens += sum(a == b for a, b in zip(g, p))
        total_tokens += len(g)
    precision, recall, f1 = precision_recall_f1(len(gold_set & pred_set), len(pred_set), len(gold_set))
    per_type: dict[str, dict[str, float]] = {}
    for kind in sorted({e[1] for e in gold_set | pred_set}):
        g_kind = {e for e in gold_set if e[1] == kind}
        p_kind = {e for e in pred_set if e[1] == kind}
        p_, r_, f_ = precision_recall_f1(len(g_kind & p_kind), len(p_kind), len(g_kind))
        per_type[kind] = {"precision": p_, "recall": r_, "f1": f_, "support": len(g_kind)}
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "accuracy": correct_tokens / total_tokens if total_tokens else 0.0,
        "per_type": per_type,
    }


# ---------------------------------------------------------------------------------------------------- SQuAD

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lowercase, drop punctuation, drop the articles a/an/the, squeeze spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised strings are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 between the normalised answers; when either is empty, 1 if both are, else 0."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    return precision_recall_f1(same, len(pred_tokens), len(gold_tokens))[2]


def _question_scores(prediction: str, answers: list[str]) -> tuple[float, float]:
    """(EM, F1) of a prediction against the best-matching of a question's normalised-nonempty answers."""
    return max(exact_match(prediction, a) for a in answers), max(token_f1(prediction, a) for a in answers)


def squad_metrics(
    predictions: dict[str, str],
    gold_answers: dict[str, list[str]],
    span_predictions: dict[str, str] | None = None,
    null_margins: dict[str, float] | None = None,
) -> dict[str, float | None]:
    """Exact Match and F1 in percent, each question scored against its best-matching gold answer.

    `gold_answers` maps a question id to its answer texts; an empty list (or only answers that normalise to "")
    marks an unanswerable SQuAD 2.0 question, whose only correct prediction is "". As in the official v2.0 script,
    "HasAns_*" and "NoAns_*" break the scores down when the data has both kinds of question, and, given each
    question's best non-empty answer (`span_predictions`) and how far the "no answer" score exceeds that answer's
    (`null_margins`, the script's "na_prob"), "best_exact" / "best_f1" are the scores at the best threshold t for
    "answer only when margin <= t", with that t in "best_exact_thresh" / "best_f1_thresh" (None: never answer).
    """
    scores: dict[str, tuple[float, float]] = {}
    has_answer: dict[str, bool] = {}
    for qid, answers in gold_answers.items():
        answers = [a for a in answers if normalize_answer(a)] or [""]
        has_answer[qid] = answers != [""]
        scores[qid] = _question_scores(predictions.get(qid, ""), answers)

    def summary(ids: list[str], prefix: str) -> dict[str, float | None]:
        return {
            f"{prefix}exact": 100.0 * sum(scores[q][0] for q in ids) / len(ids) if ids else 0.0,
            f"{prefix}f1": 100.0 * sum(scores[q][1] for q in ids) / len(ids) if ids else 0.0,
            f"{prefix}total": len(ids),
        }

    metrics = summary(list(scores), "")
    answerable = [q for q in scores if has_answer[q]]
    unanswerable = [q for q in scores if not has_answer[q]]
    if answerable and unanswerable:
        metrics.update(summary(answerable, "HasAns_"))
        metrics.update(summary(unanswerable, "NoAns_"))
    if span_predictions is not None and null_margins is not None and unanswerable:
        span_scores = {
            q: _question_scores(span_predictions.get(q, ""), [a for a in gold_answers[q] if normalize_answer(a)] or [""])
            for q in scores
        }
        for index, name in enumerate(("exact", "f1")):
            best, threshold = _best_null_threshold({q: s[index] for q, s in span_scores.items()}, span_predictions,
                                                   has_answer, null_margins)
            metrics[f"best_{name}"], metrics[f"best_{name}_thresh"] = best, threshold
    return metrics


def _best_null_threshold(
    answer_scores: dict[str, float], span_predictions: dict[str, str], has_answer: dict[str, bool],
    null_margins: dict[str, float],
) -> tuple[float, float | None]:
    """The best score (percent) over thresholds t of "answer when margin <= t, else say no answer", and its t.

    Starts from "never answer" (every unanswerable question right) and lets the questions answer in order of
    rising margin: an answerable one gains its answer's score, an unanswerable one loses its point when the
    answer is not empty.
    """
    current = best = float(sum(not has_answer[q] for q in answer_scores))
    threshold = None
    for qid in sorted(answer_scores, key=lambda q: null_margins[q]):
        if has_answer[qid]:
            current += answer_scores[qid]
        elif span_predictions.get(qid, ""):
            current -= 1
        if current > best:
            best, threshold = current, null_margins[qid]
    return 100.0 * best / len(answer_scores), threshold


def _check_lengths(a: Sequence[object], b: Sequence[object]) -> None:
    if len(a) != len(b):
        raise ValueError(f"gold and predictions differ in length ({len(a)} vs {len(b)})")
