"""Tests of `bertforge.pipelines.question_answering`: answers, scores and spans against a brute-force reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertforgeError

transformers = pytest.importorskip("transformers", reason="needs transformers: pip install -e '.[test]'")


def _qa_reference(
    model_dir: Path, question: str, context: str, max_length: int = 384, stride: int = 128, max_answer_len: int = 15,
    scoring: str = "logits", n_best: int | None = 20,
) -> tuple[str, float, int, int, float]:
    """transformers' tokenizer windows (stride = tokens shared by consecutive windows) and model logits, and a
    brute-force search over all spans. Per window, a softmax over the context tokens and [CLS] gives P(start) and
    P(end); [CLS] is excluded from spans, and with `n_best` a span starts and ends among the window's `n_best`
    highest logits. Spans are ranked by start + end logit (`scoring="logits"`, SQuAD evaluation's rule) or by
    P(start) * P(end) (`"probabilities"` with `n_best=None`: transformers' v4 QA pipeline). Returns (answer,
    P(start) * P(end) of the chosen span in its window, start, end, the lowest null probability)."""
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.BertForQuestionAnswering.from_pretrained(model_dir).eval()
    enc = tok(question, context, truncation="only_second", max_length=max_length, stride=stride,
              return_overflowing_tokens=True, return_offsets_mapping=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                    token_type_ids=enc["token_type_ids"])
    best, null = (-np.inf, 0.0, 0, 0), float("inf")  # (rank, probability, start, end)
    for w in range(len(enc["input_ids"])):
        offsets = enc["offset_mapping"][w].tolist()
        allowed = np.array([s == 1 for s in enc.sequence_ids(w)])
        keep = allowed.copy()
        keep[0] = True
        starts, ends = (logits[w].numpy()[: len(allowed)] for logits in (out.start_logits, out.end_logits))
        real = enc["attention_mask"][w].numpy().astype(bool)  # not padding

        def probs(x: np.ndarray) -> np.ndarray:
            x = np.where(keep, x.astype(np.float64), -np.inf)  # noqa: B023 (called within the iteration)
            p = np.exp(x - x.max())
            return p / p.sum()

        def top(x: np.ndarray) -> set[int]:
            order = np.argsort(np.where(real, x, -np.inf))[::-1][: int(real.sum())]  # noqa: B023
            return set(order[:n_best].tolist()) if n_best is not None else set(order.tolist())

        start, end = probs(starts), probs(ends)
        top_starts, top_ends = top(starts), top(ends)
        null = min(null, start[0] * end[0])
        n = len(allowed)
        for s in np.flatnonzero(allowed):
            for e in range(s, min(s + max_answer_len, n)):
                if not allowed[e] or s not in top_starts or e not in top_ends:
                    continue
                rank = starts[s] + ends[e] if scoring == "logits" else start[s] * end[e]
                if rank > best[0]:
                    best = (rank, start[s] * end[e], offsets[s][0], offsets[e][1])
    _, score, a, b = best
    return context[a:b], float(score), a, b, float(null)


def test_question_answering_equals_reference(heads):
    pipe = bertforge.pipeline("question-answering", model=heads["qa"])
    cases = [
        ("Where does John live?", "John Smith lives in New York and works at a large company."),
        ("What is it?", "The European lobster is a species of clawed lobster from the eastern Atlantic Ocean."),
    ]
    results = pipe([{"question": q, "context": c} for q, c in cases])
    for (question, context), result in zip(cases, results):
        answer, score, start, end, _ = _qa_reference(heads["qa"], question, context)
        assert result["answer"] == answer == context[result["start"] : result["end"]]
        assert (result["start"], result["end"]) == (start, end)
        assert abs(result["score"] - score) < 1e-4
    assert pipe(cases[0]) == results[0]  # (question, context) tuple
    # one window: ranking by probability over every span (transformers' search) picks the same answers
    as_transformers = bertforge.pipeline("question-answering", model=heads["qa"], span_scoring="probabilities",
                                         n_best=None)
    assert as_transformers([{"question": q, "context": c} for q, c in cases]) == results
    top3 = bertforge.pipeline("question-answering", model=heads["qa"], top_k=3)(cases[0])
    assert len(top3) == 3 and top3[0] == results[0] and top3[0]["score"] >= top3[1]["score"] >= top3[2]["score"]


def test_question_answering_windows_long_context(heads):
    """A context of ~800 tokens in 64-token windows sharing 16 tokens: same windows and answer as transformers."""
    question = "What is it about?"
    context = " ".join(f"Sentence number {i} talks about lobsters and the sea." for i in range(60))
    pipe = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16)
    features, _ = pipe.featurize([(question, context)])
    assert len(features) > 10
    by_logits = pipe({"question": question, "context": context})
    answer, score, start, end, null = _qa_reference(heads["qa"], question, context, max_length=64, stride=16)
    assert (by_logits["answer"], by_logits["start"], by_logits["end"]) == (answer, start, end)
    assert abs(by_logits["score"] - score) < 1e-4
    # Ranked by probability over all spans, as transformers' v4 pipeline did: here another window's span wins.
    as_transformers = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16,
                                         span_scoring="probabilities", n_best=None)
    result = as_transformers({"question": question, "context": context})
    answer, score, start, end, null = _qa_reference(heads["qa"], question, context, max_length=64, stride=16,
                                                    scoring="probabilities", n_best=None)
    assert (result["answer"], result["start"], result["end"]) == (answer, start, end)
    assert abs(result["score"] - score) < 1e-4
    assert result["start"] != by_logits["start"]
    impossible = bertforge.pipeline("question-answering", model=heads["qa"], max_length=64, doc_stride=16,
                                    handle_impossible_answer=True, top_k=10**6, span_scoring="probabilities",
                                    n_best=None)(question=question, context=context)
    empty = [a for a in impossible if a["answer"] == ""]
    assert len(empty) == 1 and abs(empty[0]["score"] - null) < 1e-4


def test_bad_inputs(heads):
    qa = bertforge.pipeline("question-answering", model=heads["qa"])
    with pytest.raises(BertforgeError, match="input 0 has an empty question"):
        qa({"question": " ", "context": "some text"})
    with pytest.raises(BertforgeError, match="input 1 has an empty context"):
        qa([("q?", "c"), ("q?", "")])
    with pytest.raises(BertforgeError, match="input 0 must be"):
        qa(["just a string"])
    with pytest.raises(BertforgeError, match="span scoring must be one of logits, probabilities, got 'sum'"):
        bertforge.pipeline("question-answering", model=heads["qa"], span_scoring="sum")
    with pytest.raises(BertforgeError, match="n_best must be a positive integer, got 0"):
        bertforge.pipeline("question-answering", model=heads["qa"], n_best=0)
    tc = bertforge.pipeline("text-classification", model=heads["tc"])
    with pytest.raises(BertforgeError, match="input 0 must be a string"):
        tc([None])


def test_call_time_options(heads):
    """transformers' (v4) call-time options: for that call only, the same as the pipeline built with them."""
    qa = bertforge.pipeline("question-answering", model=heads["qa"])
    question = "What is it about?"
    context = " ".join(f"Sentence number {i} talks about lobsters and the sea." for i in range(30))
    item = {"question": question, "context": context}
    for options in (dict(top_k=3, max_answer_len=5), dict(handle_impossible_answer=True, top_k=50),
                    dict(max_length=64, doc_stride=16, max_question_len=8), dict(max_length=64)):
        built = bertforge.pipeline("question-answering", model=heads["qa"], **options)
        assert qa(item, **options) == built(item)
        assert qa(question=question, context=context, **options) == built(item)
    assert qa(item) == bertforge.pipeline("question-answering", model=heads["qa"])(item)
    assert (qa.top_k, qa.max_length, qa.doc_stride, qa.handle_impossible_answer) == (1, 384, 128, False)
    with pytest.raises(BertforgeError, match=r"question-answering: `max_seq_len` is not supported; .*max_length=N"):
        qa(item, max_seq_len=128)
    with pytest.raises(BertforgeError, match=r"`topk` is not supported; it is called top_k"):
        qa(item, topk=2)
    with pytest.raises(BertforgeError, match=r"`truncation` is not supported; a long context is cut into .*windows"):
        qa(item, truncation=True)
    with pytest.raises(BertforgeError, match=r"unknown option `answers`; a call takes: question, context, batch_size"):
        qa(item, answers=2)
