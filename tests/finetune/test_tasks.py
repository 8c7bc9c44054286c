"""`bertforge.finetune.tasks`: each task's label space, derived from the training data."""

from __future__ import annotations

import json

import pytest

from bertforge import BertforgeError
from bertforge.finetune.tasks import Classification


def test_label_kinds(tmp_path):
    task = Classification()
    examples = lambda labels: [type("E", (), {"label": v})() for v in labels]  # noqa: E731
    ints = task.label_overrides(examples(["1", "0", "10", "2"]), tmp_path)
    assert ints["id2label"] == {0: "0", 1: "1", 2: "2", 3: "10"}  # numeric order, not string order
    strings = task.label_overrides(examples(["pos", "neg", "neutral"]), tmp_path)
    assert strings["label2id"] == {"neg": 0, "neutral": 1, "pos": 2}
    floats = task.label_overrides(examples(["0.5", "4.000", "1"]), tmp_path)
    assert floats["problem_type"] == "regression" and floats["num_labels"] == 1
    with pytest.raises(BertforgeError, match="at least two"):
        task.label_overrides(examples(["a", "a"]), tmp_path)


def test_whole_numbers_written_as_decimals_are_said_to_make_a_regression(tmp_path, caplog):
    """Issue 46: labels written 0.0 / 1.0 (as pandas writes integer labels beside a blank) switched to regression
    without a word; now one line says so and how to get classes. Fractional scores (STS-B's) say nothing."""
    import logging

    task = Classification()
    examples = lambda labels: [type("E", (), {"label": v})() for v in labels]  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        assert task.label_overrides(examples(["0.0", "1.0", 1.0, "0"]), tmp_path)["problem_type"] == "regression"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "the labels are written as decimals (0.0, 1.0) but are whole numbers" in lines[0]
    assert "write them as integers" in lines[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        task.label_overrides(examples(["0.5", "4.000", "1"]), tmp_path)
    assert not caplog.records


def _squad_file(path, qas_for):
    """A SQuAD 2.0 file of three paragraphs; `qas_for(context)` gives each one's questions."""
    import json
    context = "the plot of this movie was very good and john lives in paris with mary ."
    data = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [dict(q, id=f"q{n}{k}") for k, q in enumerate(qas_for(context))]}
        for n in range(3)]}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_qa_training_refuses_a_file_with_no_answer_in_any_window(tiny_model, tmp_path):
    """Question answering learns spans from answers inside what the model reads: a training file whose every
    question is unanswerable, or whose every answer is longer than a window, stops with one line saying why,
    before anything is written (#34)."""
    from bertforge.finetune import finetune

    unanswerable = _squad_file(tmp_path / "none.json", lambda c: [
        {"question": "where does peter live ?", "answers": [], "is_impossible": True}])
    out = tmp_path / "out"
    with pytest.raises(BertforgeError, match="no training window holds an answer span \\(every question is unanswerable\\)"):
        finetune(task="qa", model=str(tiny_model), train=str(unanswerable), dev=str(unanswerable), out=str(out),
                 epochs=1, batch_size=2, max_length=32, doc_stride=8)
    assert not out.exists()
    long_answer = _squad_file(tmp_path / "long.json", lambda c: [
        {"question": "what ?", "answers": [{"text": c[:-2], "answer_start": 0}], "is_impossible": False}])
    with pytest.raises(BertforgeError, match="none of its 3 answers lies inside the text the model reads"):
        finetune(task="qa", model=str(tiny_model), train=str(long_answer), dev=str(long_answer), out=str(out),
                 epochs=1, batch_size=2, max_length=16, doc_stride=4)
    assert not out.exists()
    answerable = _squad_file(tmp_path / "ok.json", lambda c: [
        {"question": "where does john live ?", "answers": [{"text": "paris", "answer_start": c.index("paris")}],
         "is_impossible": False}])
    finetune(task="qa", model=str(tiny_model), train=str(answerable), dev=str(answerable), out=str(out), epochs=1,
             batch_size=2, max_length=32, doc_stride=8)
    summary = json.loads((out / "eval.json").read_text(encoding="utf-8"))
    card = (out / "model" / "README.md").read_text(encoding="utf-8")  # the model card states the run (#33)
    assert "pipeline_tag: question-answering" in card and "`bertforge finetune`" in card
    assert f"| {summary['main_metric']} |" in card and f"- started from: `{tiny_model}`" in card
