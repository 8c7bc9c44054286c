"""`bertforge predict --task qa` and `pipeline("question-answering")` choose answers by one rule
(`bertforge.data.qa_spans`): same model, same questions, same answers, over several windows and with "no answer". (The
rule itself: tests/data/test_qa_spans.py.)"""

import json
import shutil
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge import BertConfig, BertForQuestionAnswering
from bertforge.cli import main

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
    assert main(["predict", "--task", "qa", "--model", str(qa_model), "--input", str(inputs), "--out", str(output),
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
