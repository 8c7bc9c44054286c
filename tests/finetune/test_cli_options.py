"""Options of `bertforge finetune`, `evaluate` and `predict` that no other test sets: each changes what its help
says (the schedule, the parameter groups, the batches, the encoded pairs and questions, the QA answers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.finetune import api, trainer

from .conftest import write_sentiment, write_squad

FAST = ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--no-progress"]


def finetune_config(monkeypatch, *argv: str):
    seen = []
    monkeypatch.setattr(api, "finetune", lambda config: seen.append(config) or {})
    monkeypatch.setattr("bertforge.finetune.finetune", api.finetune)
    assert main(["finetune", "--task", "classification", "--model", "m", "--train", "t", "--dev", "d", "--out", "o",
                 *argv]) == 0
    (config,) = seen
    return config


FINETUNE_OPTIONS = [
    (["--warmup-ratio", "0.5"], dict(warmup_ratio=0.5)),
    (["--weight-decay", "0.3"], dict(weight_decay=0.3)),
    (["--group-by-length"], dict(group_by_length=True)),
    (["--text-pair-column", "b"], dict(text_pair_column="b")),
    (["--max-query-length", "9"], dict(max_query_length=9)),
    (["--max-answer-length", "2"], dict(max_answer_length=2)),
    (["--n-best", "3"], dict(n_best=3)),
    (["--eval-batch-size", "5"], dict(eval_batch_size=5)),
]


@pytest.mark.parametrize("argv,changed", FINETUNE_OPTIONS, ids=[" ".join(a) for a, _ in FINETUNE_OPTIONS])
def test_finetune_option_sets_its_setting_and_nothing_else(monkeypatch, argv, changed):
    base = finetune_config(monkeypatch).to_dict()
    got = finetune_config(monkeypatch, *argv).to_dict()
    assert {k: v for k, v in got.items() if base[k] != v} == changed


def run_finetune(capsys, tiny_model: Path, tmp_path: Path, *extra: str) -> Path:
    train = write_sentiment(tmp_path / "train.tsv", 24)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    rc = main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train),
               "--dev", str(dev), "--out", str(out), *FAST, *extra])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


def test_finetune_warmup_ratio_and_weight_decay(tmp_path, tiny_model, capsys, monkeypatch):
    import bertforge.optim

    groups = []
    real = bertforge.optim.parameter_groups  # the one rule every trainer's optimizer is built with
    monkeypatch.setattr(bertforge.optim, "parameter_groups", lambda model, wd: groups.append(real(model, wd)) or groups[-1])
    out = run_finetune(capsys, tiny_model, tmp_path, "--epochs", "2", "--batch-size", "4", "--log-every", "1",
                       "--warmup-ratio", "0.5", "--weight-decay", "0.3")
    lrs = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "train"]
    # 24 examples, batch 4, 2 epochs: 12 steps, 6 of them (half) rising to the peak, then falling towards 0 at step 12
    assert lrs == pytest.approx([1e-3 * s / 6 for s in range(1, 7)] + [1e-3 * (12 - s) / 6 for s in range(6, 12)])
    assert sorted(g["weight_decay"] for g in groups[-1]) == [0.0, 0.3]
    assert all(p.ndim == 1 for p in groups[-1][1]["params"])  # no decay: biases and LayerNorm weights


def test_finetune_batches_are_plain_shuffled_unless_grouped_by_length(tmp_path, tiny_model, capsys, monkeypatch):
    made = []
    real = trainer.training_batches

    def recording(lengths, batch_size, generator, group_by_length):
        batches = real(lengths, batch_size, generator, group_by_length)
        made.append([[lengths[i] for i in b] for b in batches])
        return batches

    monkeypatch.setattr(trainer, "training_batches", recording)
    run_finetune(capsys, tiny_model, tmp_path, "--batch-size", "4", "--group-by-length")
    assert all(b == sorted(b, reverse=True) for b in made[-1])  # grouped: each batch of similar, sorted lengths
    run_finetune(capsys, tiny_model, tmp_path, "--batch-size", "4")
    assert any(b != sorted(b, reverse=True) for b in made[-1])  # the default: plain shuffled batches


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_model) -> Path:
    root = tmp_path_factory.mktemp("classifier")
    write_sentiment(root / "train.tsv", 16)
    assert main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(root / "train.tsv"),
                 "--dev", str(root / "train.tsv"), "--out", str(root / "run"), *FAST]) == 0
    return root / "run" / "model"


def recorded_batches(monkeypatch) -> list[dict[str, torch.Tensor]]:
    batches = []
    real = trainer.collate
    monkeypatch.setattr(trainer, "collate", lambda features, pad: batches.append(real(features, pad)) or batches[-1])
    return batches


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_text_pair_column_and_eval_batch_size(tmp_path, classifier, capsys, monkeypatch, command):
    data = tmp_path / "pairs.csv"
    data.write_text("a,b,label\n" + "".join(f"good movie,{'bad plot' if i % 2 else 'great film'},{'neg' if i % 2 else 'pos'}\n"
                                          for i in range(12)))
    io = ["--data", str(data)] if command == "evaluate" else ["--input", str(data), "--output", str(tmp_path / "p.jsonl")]
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
        assert main(["predict", "--task", "qa", "--model", str(model), "--input", str(squad), "--output", str(output),
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
