"""`bertforge evaluate` (`bertforge.commands.evaluate`): its options, and the models and data it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.cli import main
from tests.finetune.conftest import write_sentiment

from .cmd_helpers import FAST, finetune, recorded_batches

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model) -> Path:
    root = tmp_path_factory.mktemp("classifier")
    write_sentiment(root / "train.tsv", 16)
    assert main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(root / "train.tsv"),
                 "--dev", str(root / "train.tsv"), "--out", str(root / "run"), *FAST]) == 0
    return root / "run" / "model"


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_text_pair_column_and_eval_batch_size(tmp_path, classifier, capsys, monkeypatch, command):
    data = tmp_path / "pairs.csv"
    data.write_text("a,b,label\n" + "".join(f"good movie,{'bad plot' if i % 2 else 'great film'},{'neg' if i % 2 else 'pos'}\n"
                                          for i in range(12)))
    io = ["--input", str(data)] if command == "evaluate" else ["--input", str(data), "--out", str(tmp_path / "p.jsonl")]
    argv = [command, "--task", "classification", "--model", str(classifier), *io, "--text-column", "a", "--no-progress"]
    batches = recorded_batches(monkeypatch)
    assert main(argv) == 0
    assert [len(b["input_ids"]) for b in batches] == [12]  # default 64 a batch
    assert all((b["token_type_ids"] == 0).all() for b in batches)  # one text: segment A only
    single = batches[0]["input_ids"].shape[1]
    batches.clear()
    assert main([*argv, "--text-pair-column", "b", "--eval-batch-size", "5"]) == 0
    assert [len(b["input_ids"]) for b in batches] == [5, 5, 2]
    for b in batches:
        assert ((b["token_type_ids"] == 1).sum(1) == 3).all()  # "bad plot [SEP]" / "great film [SEP]": segment B
    assert batches[0]["input_ids"].shape[1] == single + 3


def test_evaluate_rejects_unseen_labels_and_untrained_heads(tmp_path, tiny_model, capsys):
    train = write_sentiment(tmp_path / "train.tsv", 16)
    out = tmp_path / "run"
    finetune(capsys, tiny_model, "classification", train, train, out)
    unseen = write_sentiment(tmp_path / "unseen.tsv", 4, labels=("neg", "meh"))
    assert main(["evaluate", "--task", "classification", "--model", str(out / "model"), "--input", str(unseen)]) == 2
    assert "unseen.tsv:3: label 'meh' was not seen in training" in capsys.readouterr().err
    assert main(["evaluate", "--task", "classification", "--model", str(tiny_model), "--input", str(train)]) == 2
    assert "not a BertForSequenceClassification" in capsys.readouterr().err
    assert main(["evaluate", "--task", "ner", "--model", str(out / "model"), "--input", str(train)]) == 2
    capsys.readouterr()
