"""`bertforge predict` (`bertforge.commands.predict`): what its options change in the predictions it writes."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge.cli import main
from bertforge.core.linear import int8_available
from tests.finetune.conftest import write_squad
from tests.model.test_quantize import TEXTS as INT8_TEXTS

from .cmd_helpers import FAST, recorded_batches

# tiny_model (the tiny BERT of the fine-tuning tests) and int8_models (tests/model/test_quantize.py's tiny models):
# fixtures of tests/commands/conftest.py

needs_int8 = pytest.mark.skipif(not int8_available(), reason="this PyTorch has no dynamic int8 linear kernels")


def test_qa_limits(tmp_path, tiny_model, capsys, monkeypatch):
    squad = write_squad(tmp_path / "squad.json", version_2=False)
    out = tmp_path / "qa"
    assert main(["finetune", "--task", "qa", "--model", str(tiny_model), "--train", str(squad), "--dev", str(squad),
                 "--out", str(out), "--max-length", "48", "--doc-stride", "16", *FAST]) == 0
    capsys.readouterr()
    model = out / "model"

    def predict(*extra: str) -> tuple[list[dict], list[dict[str, torch.Tensor]]]:
        batches = recorded_batches(monkeypatch)
        output = tmp_path / "pred.jsonl"
        assert main(["predict", "--task", "qa", "--model", str(model), "--input", str(squad), "--out", str(output),
                     "--max-length", "48", "--doc-stride", "16", "--no-progress", *extra]) == 0
        monkeypatch.undo()
        return [json.loads(line) for line in output.read_text().splitlines()], batches

    def question_lengths(batches) -> set[int]:  # tokens of segment A less [CLS] and [SEP]
        return {int(n) - 2 for b in batches for n in (b["token_type_ids"] == 0).logical_and(b["attention_mask"] == 1).sum(1)}

    default, batches = predict()
    assert max(question_lengths(batches)) > 3  # "what city does the actors loves ?": 7 tokens
    cut, batches = predict("--max-query-length", "3")
    assert question_lengths(batches) == {3}

    def span(record: dict) -> int:
        return len(record["answer"].split())

    assert max(span(r) for r in default) > 1
    short, _ = predict("--max-answer-length", "1")
    assert all(span(r) <= 1 for r in short) and any(span(r) == 1 for r in short)

    from bertforge.finetune import tasks

    seen = []
    real = tasks.best_answers  # (examples, windows, start_logits, end_logits, n_best, max_answer_length, ...)
    monkeypatch.setattr(tasks, "best_answers", lambda *a: seen.append(a[4]) or real(*a))
    one, _ = predict("--n-best", "1")
    assert seen == [1]
    assert one != default  # one start and one end candidate per window: some answers are lost or change


@needs_int8
def test_predict_and_evaluate_cli_quantize(int8_models, tmp_path, capsys):
    data = tmp_path / "data.csv"
    data.write_text("text,label\n" + "".join(f"{t},{['neg', 'pos'][i % 2]}\n" for i, t in enumerate(INT8_TEXTS)))
    common = ["--task", "classification", "--model", str(int8_models["classify"])]
    assert main(["predict", *common, "--input", str(data), "--out", str(tmp_path / "a.jsonl")]) == 0
    assert main(["predict", *common, "--input", str(data), "--out", str(tmp_path / "b.jsonl"),
                 "--quantize", "int8"]) == 0
    fp32, int8 = ([json.loads(line) for line in (tmp_path / n).read_text().splitlines()] for n in ("a.jsonl", "b.jsonl"))
    assert [r["label"] for r in int8] == [r["label"] for r in fp32]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(fp32, int8)) < 0.05
    capsys.readouterr()
    assert main(["evaluate", *common, "--input", str(data), "--quantize", "int8"]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out)
    assert main(["predict", *common, "--input", str(data), "--out", str(tmp_path / "c.jsonl"),
                 "--quantize", "int8", "--device", "cuda"]) != 0
    assert "CPU inference" in capsys.readouterr().err and not (tmp_path / "c.jsonl").exists()
