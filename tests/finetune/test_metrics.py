"""Metric functions against hand-computed values, independent reference formulas, and the reference implementations
(scikit-learn, scipy, seqeval, the official SQuAD v2.0 evaluation) on random inputs."""

import math
import random

import numpy as np
import pytest

from bertforge.finetune import metrics as M


def test_binary_classification_by_hand():
    gold = [1, 1, 0, 0, 1, 0]
    pred = [1, 0, 0, 1, 1, 0]
    # TP = 2 (0, 4), FN = 1 (1), FP = 1 (3), TN = 2 (2, 5)
    assert M.accuracy(gold, pred) == pytest.approx(4 / 6)
    assert M.f1_for_class(gold, pred, 1) == pytest.approx(2 / 3)
    assert M.macro_f1(gold, pred) == pytest.approx(2 / 3)  # class 0 also has P = R = 2/3
    assert M.matthews_corrcoef(gold, pred) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3 * 3 * 3 * 3))
    assert M.classification_metrics(gold, pred, 2).keys() == {"accuracy", "f1", "macro_f1", "mcc"}


def test_f1_and_mcc_degenerate_cases():
    assert M.f1_for_class([0, 0], [0, 0], positive=1) == 0.0  # no positives anywhere
    assert M.matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0  # constant prediction: undefined -> 0
    assert M.matthews_corrcoef([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert M.matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        M.accuracy([1], [1, 0])


def gorodkin_mcc(gold, pred, k):
    """The K-category correlation coefficient in Gorodkin's confusion-matrix form (an independent reference)."""
    c = np.zeros((k, k))
    for g, p in zip(gold, pred):
        c[g, p] += 1
    numerator = sum(c[a, a] * c[b, m] - c[a, b] * c[m, a] for a in range(k) for b in range(k) for m in range(k))
    rows, cols = c.sum(1), c.sum(0)
    first = sum(rows[a] * (rows.sum() - rows[a]) for a in range(k))
    second = sum(cols[a] * (cols.sum() - cols[a]) for a in range(k))
    return numerator / math.sqrt(first * second)


def reference_macro_f1(gold, pred):
    scores = []
    for c in sorted(set(gold) | set(pred)):
        tp = sum(g == p == c for g, p in zip(gold, pred))
        fp = sum(p == c != g for g, p in zip(gold, pred))
        fn = sum(g == c != p for g, p in zip(gold, pred))
        scores.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    return sum(scores) / len(scores)


def test_multiclass_against_reference_formulas():
    rng = random.Random(0)
    for _ in range(20):
        gold = [rng.randrange(4) for _ in range(50)]
        pred = [g if rng.random() < 0.6 else rng.randrange(4) for g in gold]
        assert M.matthews_corrcoef(gold, pred) == pytest.approx(gorodkin_mcc(gold, pred, 4))
        assert M.macro_f1(gold, pred) == pytest.approx(reference_macro_f1(gold, pred))


def test_pearson_spearman_by_hand():
    # x mean 2, y mean 13/3: cov = 5, var_x = 2, var_y = 114/9
    assert M.pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(5 / math.sqrt(2 * 114 / 9))
    assert M.pearson([1, 1, 1], [1, 2, 3]) == 0.0
    assert M.ranks([10, 20, 20, 5]) == [2.0, 3.5, 3.5, 1.0]
    x, y = [1, 2, 2, 3], [1, 3, 2, 4]
    assert M.spearman(x, y) == pytest.approx(np.corrcoef([1, 2.5, 2.5, 4], [1, 3, 2, 4])[0, 1])
    assert M.spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=40), rng.normal(size=40)
    assert M.pearson(list(a), list(b)) == pytest.approx(np.corrcoef(a, b)[0, 1])
    scores = M.regression_metrics([1.0, 2.0], [1.5, 2.0])
    assert scores["mse"] == pytest.approx(0.125) and scores["pearson"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "tags, spans",
    [
        # IOB2: every entity opens with B-
        (["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"], [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 6)]),
        # IOB1 (original CoNLL-2003): I- opens an entity, B- only splits two adjacent entities of one type
        (["I-PER", "I-PER", "B-PER", "O", "I-LOC", "I-ORG"], [("PER", 0, 2), ("PER", 2, 3), ("LOC", 4, 5), ("ORG", 5, 6)]),
        # an I- after O or after another type opens a new entity (conlleval / seqeval default mode)
        (["O", "I-MISC", "I-MISC", "B-PER", "I-LOC"], [("MISC", 1, 3), ("PER", 3, 4), ("LOC", 4, 5)]),
        # IOBES
        (["S-PER", "B-LOC", "E-LOC", "O", "B-ORG", "I-ORG", "E-ORG"], [("PER", 0, 1), ("LOC", 1, 3), ("ORG", 4, 7)]),
        (["O", "O"], []),
        (["B-PER"], [("PER", 0, 1)]),
    ],
)
def test_entity_spans(tags, spans):
    assert M.entity_spans(tags) == spans


def test_iob1_and_iob2_encodings_score_the_same():
    iob2 = [["B-PER", "I-PER", "B-PER", "O", "B-LOC"], ["O", "B-ORG", "I-ORG"]]
    iob1 = [["I-PER", "I-PER", "B-PER", "O", "I-LOC"], ["O", "I-ORG", "I-ORG"]]
    assert [M.entity_spans(s) for s in iob1] == [M.entity_spans(s) for s in iob2]
    assert M.entity_metrics(iob2, iob1)["f1"] == 1.0
    assert M.entity_metrics(iob1, iob2)["f1"] == 1.0


def test_entity_metrics_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O"]]
    scores = M.entity_metrics(gold, pred)
    # gold: PER(0-2), LOC(3), ORG(s2 0); predicted: PER(0-2), ORG(3), ORG(s2 0); 2 of 3 right either way
    assert scores["precision"] == pytest.approx(2 / 3)
    assert scores["recall"] == pytest.approx(2 / 3)
    assert scores["f1"] == pytest.approx(2 / 3)
    assert scores["accuracy"] == pytest.approx(5 / 6)
    per = scores["per_type"]
    assert per["PER"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1}
    assert per["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
    assert per["ORG"]["precision"] == 0.5 and per["ORG"]["recall"] == 1.0
    assert per["ORG"]["f1"] == pytest.approx(2 / 3) and per["ORG"]["support"] == 1


def test_partial_span_is_wrong():
    scores = M.entity_metrics([["B-ORG", "I-ORG", "I-ORG"]], [["B-ORG", "I-ORG", "O"]])
    assert scores["f1"] == 0.0 and scores["accuracy"] == pytest.approx(2 / 3)


def test_squad_normalisation_and_scores():
    assert M.normalize_answer("The  Quick, brown fox!") == "quick brown fox"
    assert M.normalize_answer("an apple a day") == "apple day"
    assert M.normalize_answer("theatre") == "theatre"  # only whole-word articles go
    assert M.exact_match("the Broncos", "Broncos") == 1.0
    # prediction [cat, sat] vs gold [cat, sat, down]: P = 1, R = 2/3
    assert M.token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    assert M.token_f1("", "") == 1.0 and M.token_f1("x", "") == 0.0
    gold = {
        "q1": ["Denver Broncos", "Broncos"],
        "q2": [],  # unanswerable
        "q3": [],
        "q4": ["Santa Clara, California"],
    }
    predictions = {"q1": "the Broncos", "q2": "", "q3": "Levi's Stadium", "q4": "Santa Clara"}
    scores = M.squad_metrics(predictions, gold)
    assert scores["exact"] == pytest.approx(50.0)
    assert scores["f1"] == pytest.approx(100 * (1 + 1 + 0 + 0.8) / 4)
    assert scores["total"] == 4
    assert scores["HasAns_exact"] == pytest.approx(50.0) and scores["HasAns_f1"] == pytest.approx(90.0)
    assert scores["NoAns_exact"] == pytest.approx(50.0) and scores["NoAns_total"] == 2
    # SQuAD 1.1: no NoAns breakdown; the best of several gold answers counts; a missing prediction is ""
    v1 = M.squad_metrics({"a": "Denver"}, {"a": ["Denver Broncos", "Denver"], "b": ["x"]})
    assert v1["exact"] == 50.0 and "NoAns_exact" not in v1


def test_squad_best_null_threshold_by_hand():
    gold = {"q1": ["paris"], "q2": [], "q3": ["london"], "q4": []}
    spans = {"q1": "Paris", "q2": "berlin", "q3": "rome", "q4": "x"}
    margins = {"q1": -2.0, "q2": 1.0, "q3": 0.5, "q4": 3.0}  # no-answer score minus best span score
    final = {"q1": "Paris", "q2": "", "q3": "", "q4": ""}
    scores = M.squad_metrics(final, gold, spans, margins)
    # never answering gets q2 and q4 (2/4); answering q1 (margin -2) adds 1 -> 3/4; q3 adds 0, q2 and q4 lose 1
    assert scores["best_exact"] == pytest.approx(75.0) and scores["best_exact_thresh"] == -2.0
    assert scores["best_f1"] == pytest.approx(75.0) and scores["best_f1_thresh"] == -2.0
    hopeless = M.squad_metrics(final, gold, {q: "x" for q in gold}, margins)
    assert hopeless["best_f1"] == pytest.approx(50.0) and hopeless["best_f1_thresh"] is None


def test_multi_label_metrics_equal_scikit_learns():
    import random

    sklearn = pytest.importorskip("sklearn.metrics")
    from bertforge.finetune.metrics import multi_label_metrics

    rng = random.Random(0)
    for _trial in range(20):
        n, k = rng.randint(1, 30), rng.randint(2, 6)
        gold = [[j for j in range(k) if rng.random() < 0.4] for _ in range(n)]
        pred = [[j for j in range(k) if rng.random() < 0.4] for _ in range(n)]
        hot = lambda sets: [[int(j in s) for j in range(k)] for s in sets]  # noqa: E731, B023 (used within the iteration)
        ours = multi_label_metrics(gold, pred, k)
        assert ours["micro_f1"] == pytest.approx(sklearn.f1_score(hot(gold), hot(pred), average="micro", zero_division=0))
        assert ours["macro_f1"] == pytest.approx(sklearn.f1_score(hot(gold), hot(pred), average="macro", zero_division=0))
        assert ours["subset_accuracy"] == pytest.approx(sklearn.accuracy_score(hot(gold), hot(pred)))


# ------------------------------------------------------------------ every metric against its reference implementation
# The references: scikit-learn (classes), scipy (correlations), seqeval (entities) and the official SQuAD v2.0
# evaluation script's functions, transcribed below (it is a script, not a package). Random inputs, many trials.


def test_class_metrics_equal_scikit_learns_on_random_labels():
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = random.Random(1)
    for _trial in range(200):
        n, k = rng.randint(1, 40), rng.randint(2, 5)
        gold = [rng.randrange(k) for _ in range(n)]
        pred = [g if rng.random() < 0.5 else rng.randrange(k) for g in gold]
        ours = M.classification_metrics(gold, pred, k)
        assert ours["accuracy"] == pytest.approx(sklearn.accuracy_score(gold, pred))
        assert ours["macro_f1"] == pytest.approx(sklearn.f1_score(gold, pred, average="macro", zero_division=0))
        assert ours["mcc"] == pytest.approx(sklearn.matthews_corrcoef(gold, pred), abs=1e-12)
        if k == 2:
            assert ours["f1"] == pytest.approx(sklearn.f1_score(gold, pred, pos_label=1, zero_division=0))


def test_correlations_and_mse_equal_scipys_on_random_scores():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    for trial in range(200):
        n = int(rng.integers(3, 40))
        gold = rng.normal(size=n)
        pred = gold * rng.uniform(-1, 1) + rng.normal(size=n)
        if trial % 3 == 0:  # ties, as scores on a 0-5 scale in steps of 0.2 have
            gold, pred = np.round(gold * 2) / 2, np.round(pred * 2) / 2
        if np.ptp(gold) == 0 or np.ptp(pred) == 0:
            continue
        ours = M.regression_metrics(list(gold), list(pred))
        assert ours["pearson"] == pytest.approx(stats.pearsonr(gold, pred)[0], abs=1e-10)
        assert ours["spearman"] == pytest.approx(stats.spearmanr(gold, pred)[0], abs=1e-10)
        assert ours["mse"] == pytest.approx(float(np.mean((gold - pred) ** 2)))


@pytest.mark.parametrize("prefixes", ["BIO", "BIOES"])
def test_entity_metrics_equal_seqevals_on_random_tags(prefixes):
    """seqeval's default (conlleval) mode on random tag sequences, invalid transitions included (an I- after O or
    after another type, an E- without its B-)."""
    seqeval = pytest.importorskip("seqeval.metrics")
    rng = random.Random(3)
    tags = ["O"] + [f"{p}-{t}" for p in prefixes.replace("O", "") for t in ("PER", "LOC", "ORG")]
    for _trial in range(200):
        gold = [[rng.choice(tags) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 5))]
        pred = [[t if rng.random() < 0.6 else rng.choice(tags) for t in sentence] for sentence in gold]
        ours = M.entity_metrics(gold, pred)
        assert ours["precision"] == pytest.approx(seqeval.precision_score(gold, pred, zero_division=0))
        assert ours["recall"] == pytest.approx(seqeval.recall_score(gold, pred, zero_division=0))
        assert ours["f1"] == pytest.approx(seqeval.f1_score(gold, pred, zero_division=0))
        assert ours["accuracy"] == pytest.approx(seqeval.accuracy_score(gold, pred))
        report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0)
        for kind, scores in ours["per_type"].items():
            if scores["support"]:  # seqeval reports the types of the gold entities
                assert scores["f1"] == pytest.approx(report[kind]["f1-score"]), kind
                assert scores["support"] == report[kind]["support"], kind


def official_normalize_answer(s):
    """SQuAD v2.0's evaluate-v2.0.py `normalize_answer`, as written there."""
    import re
    import string

    def remove_articles(text):
        regex = re.compile(r"\b(a|an|the)\b", re.UNICODE)
        return re.sub(regex, " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_compute_f1(a_gold, a_pred):
    """evaluate-v2.0.py's `compute_f1` (with its `get_tokens`)."""
    import collections

    gold_toks = official_normalize_answer(a_gold).split() if a_gold else []
    pred_toks = official_normalize_answer(a_pred).split() if a_pred else []
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision, recall = num_same / len(pred_toks), num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def official_best_thresh(preds, scores, na_probs, qid_to_has_ans):
    """evaluate-v2.0.py's `find_best_thresh`."""
    cur_score = best_score = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
    best_thresh = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        diff = scores[qid] if qid_to_has_ans[qid] else (-1 if preds[qid] else 0)
        cur_score += diff
        if cur_score > best_score:
            best_score, best_thresh = cur_score, na_probs[qid]
    return 100.0 * best_score / len(scores), best_thresh


def test_squad_scores_equal_the_official_scripts_on_random_answers():
    rng = random.Random(4)
    words = ["the", "a", "an", "Paris", "paris", "city", "of", "light", "1,000", "U.S.", "don't", "—", "Élan", "élan",
             "(1998)", "river", "Seine", "  ", "!", "the.", "an,"]

    def text():
        return " ".join(rng.choice(words) for _ in range(rng.randint(0, 5)))

    for _trial in range(300):
        s = text() + rng.choice(["", ".", " ", "\t", "?!"])
        assert M.normalize_answer(s) == official_normalize_answer(s), s
        gold, pred = text(), text()
        assert M.token_f1(pred, gold) == pytest.approx(official_compute_f1(gold, pred)), (gold, pred)
        assert M.exact_match(pred, gold) == int(official_normalize_answer(gold) == official_normalize_answer(pred))
    for _trial in range(50):  # whole sets: EM / F1, HasAns / NoAns, the best null threshold
        ids = [f"q{i}" for i in range(rng.randint(2, 12))]
        gold = {q: [text() for _ in range(rng.randint(0, 3))] for q in ids}
        spans = {q: text() or "x" for q in ids}
        margins = {q: rng.uniform(-3, 3) for q in ids}
        final = {q: spans[q] if margins[q] <= 0 else "" for q in ids}
        ours = M.squad_metrics(final, gold, spans, margins)
        answers = {q: [a for a in gold[q] if official_normalize_answer(a)] or [""] for q in ids}
        has = {q: answers[q] != [""] for q in ids}
        exact = {q: max(int(official_normalize_answer(a) == official_normalize_answer(final[q])) for a in answers[q])
                 for q in ids}
        f1 = {q: max(official_compute_f1(a, final[q]) for a in answers[q]) for q in ids}
        assert ours["exact"] == pytest.approx(100.0 * sum(exact.values()) / len(ids))
        assert ours["f1"] == pytest.approx(100.0 * sum(f1.values()) / len(ids))
        for prefix, keep in (("HasAns_", True), ("NoAns_", False)):
            chosen = [q for q in ids if has[q] == keep]
            if chosen and len(chosen) < len(ids):
                assert ours[f"{prefix}f1"] == pytest.approx(100.0 * sum(f1[q] for q in chosen) / len(chosen))
        if not all(has.values()):  # the best threshold, scored on each question's best span (`span_predictions`)
            span_exact = {q: max(int(official_normalize_answer(a) == official_normalize_answer(spans[q]))
                                 for a in answers[q]) for q in ids}
            span_f1 = {q: max(official_compute_f1(a, spans[q]) for a in answers[q]) for q in ids}
            for name, scores in (("exact", span_exact), ("f1", span_f1)):
                best, thresh = official_best_thresh(spans, scores, margins, has)
                assert ours[f"best_{name}"] == pytest.approx(best)
                if ours[f"best_{name}_thresh"] is not None:
                    assert ours[f"best_{name}_thresh"] == thresh
