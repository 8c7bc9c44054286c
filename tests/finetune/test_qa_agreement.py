"""`bertforge predict --task qa` and `pipeline("question-answering")` choose answers by one rule
(`bertforge.qa_spans`): same model, same questions, same answers, over several windows and with "no answer"."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bertforge
from bertforge import BertConfig, BertForQuestionAnswering
from bertforge.cli import main
from bertforge.qa_spans import Window, decode_spans

from .conftest import QA_FACTS

FILLER = "the plot of this movie was very good and the actors were great . "
QUESTIONS = [question for _, question, _ in QA_FACTS] + ["who is the company of mary ?", "what city ?"]


@pytest.fixture(scope="module")
def qa_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT with a random, confident QA head, saved as a SQuAD 2.0 model (it may say "no answer")."""
    config = BertConfig.from_pretrained(tiny_model)
    config.num_labels = 2
    config.architectures = ["BertForQuestionAnswering"]
    config.extra["version_2_with_negative"] = True
    torch.manual_seed(7)
    model = BertForQuestionAnswering(config).eval()
    with torch.no_grad():
        model.qa_outputs.weight.normal_(0.0, 0.5)  # varied, confident logits rather than near-uniform ones
    out = tmp_path_factory.mktemp("qa_model")
    model.save_pretrained(out)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, out / name)
    return out


def cases() -> list[dict[str, str]]:
    """Every question against contexts of one window (max_length 32) to ten."""
    contexts = [context for context, _, _ in QA_FACTS]
    contexts += [FILLER * copies + context + " " + FILLER for copies, (context, _, _) in enumerate(QA_FACTS, 1)]
    contexts.append(" ".join(FILLER * 3 + context for context, _, _ in QA_FACTS))
    return [{"id": f"q{i}-{j}", "question": q, "context": c}
            for i, c in enumerate(contexts) for j, q in enumerate(QUESTIONS)]


def test_predict_and_pipeline_give_the_same_answers(qa_model, tmp_path, capsys):
    inputs = tmp_path / "questions.jsonl"
    inputs.write_text("".join(json.dumps(c) + "\n" for c in cases()), encoding="utf-8")
    output = tmp_path / "predictions.jsonl"
    assert main(["predict", "--task", "qa", "--model", str(qa_model), "--input", str(inputs), "--output", str(output),
                 "--max-length", "32", "--doc-stride", "8", "--no-progress"]) == 0
    capsys.readouterr()
    predicted = [json.loads(line) for line in output.read_text().splitlines()]

    settings = dict(max_length=32, doc_stride=8, max_answer_len=30)  # predict's defaults: n_best 20, 30 tokens
    pipe = bertforge.pipeline("question-answering", model=qa_model, **settings)
    answers = pipe([{"question": c["question"], "context": c["context"]} for c in cases()])
    assert len(pipe.featurize([(cases()[-1]["question"], cases()[-1]["context"])])[0]) >= 8
    for record, answer in zip(predicted, answers):
        assert record["answer"] == answer["answer"], record["id"]
        if record["answer"]:
            assert (record["start"], record["end"]) == (answer["start"], answer["end"])
    said_nothing = sum(r["answer"] == "" for r in predicted)
    assert 0 < said_nothing < len(predicted)  # both decisions are exercised

    # The rule matters: ranking by per-window probabilities (transformers' v4 pipeline) answers some differently.
    by_probability = bertforge.pipeline("question-answering", model=qa_model, span_scoring="probabilities",
                                        n_best=None, **settings)
    different = by_probability([{"question": c["question"], "context": c["context"]} for c in cases()])
    assert any(a["answer"] != b["answer"] for a, b in zip(answers, different))


def test_decode_spans_rules_differ_across_windows_only():
    """Within a window both rules rank alike; across windows a span with the larger logit sum can have the smaller
    probability (its window has stronger competitors), and the null decision follows the chosen rule."""
    # [CLS] q [SEP] c c c [SEP]: context tokens 3..5 at characters 0-1, 2-3, 4-5 (window a) and 6-7, ... (window b)
    a = Window(0, [None, None, None, (0, 1), (2, 3), (4, 5), None])
    b = Window(0, [None, None, None, (6, 7), (8, 9), (10, 11), None])
    a_starts = np.array([0, 0, 0, 5, 5, 0, 0], dtype=np.float32)  # two strong starts share the probability
    a_ends = np.array([0, 0, 0, 5, 0, 0, 0], dtype=np.float32)
    b_starts = np.array([0, 0, 0, 4.5, 0, 0, 0], dtype=np.float32)
    b_ends = np.array([0, 0, 0, 4.5, 0, 0, 0], dtype=np.float32)
    windows = [(a, a_starts, a_ends), (b, b_starts, b_ends)]
    by_logits = decode_spans(windows, scoring="logits", top_k=3)
    by_probability = decode_spans(windows, scoring="probabilities", top_k=3)
    assert (by_logits.spans[0].start, by_logits.spans[0].end, by_logits.spans[0].logit) == (0, 1, 10.0)
    assert (by_probability.spans[0].start, by_probability.spans[0].end) == (6, 7)
    assert by_logits.spans[0].probability < by_probability.spans[0].probability
    # one window alone: the same order either way
    alone = [decode_spans([windows[0]], scoring=s, top_k=3).spans for s in ("logits", "probabilities")]
    assert [(x.start, x.end) for x in alone[0]] == [(x.start, x.end) for x in alone[1]]
    assert not by_logits.null_wins() and by_logits.null_rank() == 3  # [CLS] logits 0: below every span
    a_starts[0] = a_ends[0] = b_starts[0] = b_ends[0] = 5.1  # null logit sum 10.2 > 10
    assert decode_spans(windows, scoring="logits").null_wins()
    # n_best: only the window's best start and end are candidates; no valid span when they do not pair
    assert decode_spans([(a, a_starts, np.array([0, 0, 0, 0, 0, 0, 9], dtype=np.float32))], n_best=1).spans == []
