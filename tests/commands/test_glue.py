"""`bertforge glue` (`bertforge.commands.glue`) end to end: the GLUE table and report it writes, each task's scores
against scikit-learn / scipy on the saved models' predictions, and the run it refuses to replace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.finetune import predict
from bertforge.finetune.glue import read_split, task_named
from tests.finetune.test_glue import write_glue, write_task

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py

sklearn_metrics = pytest.importorskip("sklearn.metrics")
scipy_stats = pytest.importorskip("scipy.stats")


def reference_scores(task_name: str, model: Path, data: Path) -> dict[str, float]:
    """The task's official metrics (scikit-learn / scipy) on the saved model's predictions for the original files."""
    task = task_named(task_name)
    columns = dict(text_column=task.text, text_pair_column=task.pair, label_column=task.label,
                   no_header=not task.header, device="cpu", progress=False)
    scores = {}
    for stem, split in task.dev_splits:
        gold = [e.label for e in read_split(task, data / task_name / f"{stem}.tsv")]
        records = predict("classification", model, data / task_name / f"{stem}.tsv", **columns)
        suffix = f"_{split}" if split else ""
        if task.regression:
            y, p = [float(g) for g in gold], [r["score"] for r in records]
            scores.update(pearson=scipy_stats.pearsonr(y, p)[0], spearman=scipy_stats.spearmanr(y, p)[0])
            continue
        pred = [r["label"] for r in records]
        official = {"accuracy": sklearn_metrics.accuracy_score, "mcc": sklearn_metrics.matthews_corrcoef,
                    "f1": lambda y, p: sklearn_metrics.f1_score(y, p, pos_label="1")}
        scores.update({metric + suffix: official[metric](gold, pred) for metric in task.metrics})
    return {name: 100 * scores[name] for name in task.score_names()}


def test_glue_command_end_to_end(tmp_path, tiny_model, capsys, monkeypatch):
    data = write_glue(tmp_path / "data", ["CoLA", "MRPC", "STS-B", "MNLI"], n_train=32, n_dev=16)
    write_task(tmp_path / "data", "RTE", "rte")
    (tmp_path / "data" / "rte" / "train.tsv").unlink()  # skipped with a note
    out = tmp_path / "runs" / "glue"
    argv = ["glue", "--model", str(tiny_model), "--data-dir", str(data), "--out", str(out),
            "--max-train-examples", "24",
            "--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--warmup-ratio", "0.2", "--weight-decay", "0.0",
            "--seed", "3", "--grad-accum", "1", "--max-length", "32", "--eval-batch-size", "8", "--lenient-rows",
            "--device", "cpu", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "glue.json").read_text())
    assert list(report["tasks"]) == ["CoLA", "MRPC", "STS-B", "MNLI"]
    assert report["skipped"] == {"RTE": "rte/ has no train.tsv", "SST-2": "no SST-2/ directory",
                                 "QQP": "no QQP/ directory", "QNLI": "no QNLI/ directory"}
    assert printed.startswith(report["table"]) and "RTE skipped: rte/ has no train.tsv" in printed
    assert report["table"].splitlines()[0] == ("| model | CoLA MCC | MRPC F1/acc | STS-B Pearson/Spearman | "
                                               "MNLI m/mm acc | average |")
    markdown = (out / "glue.md").read_text()
    assert report["table"] in markdown and "over the 4 tasks run here (of 8)" in markdown
    assert "- QQP skipped: no QQP/ directory" in markdown and "at most 24 training examples" in markdown
    assert report["settings"]["finetune"]["lr"] == 1e-3 and report["settings"]["max_train_examples"] == 24
    task_numbers = []
    for name, result in report["tasks"].items():
        assert result["train"] == {"file": str(data / name / "train.tsv"), "examples": 24, "available": 32}
        assert sorted(p.name for p in (out / name).iterdir()) == [
            "checkpoints", "eval.json", "finetune_config.json", "glue_task.json", "metrics.jsonl", "model",
            "tensorboard", "training_curve.png"]
        assert json.loads((out / name / "glue_task.json").read_text()) == result  # what --resume reads back
        expected = reference_scores(name, out / name / "model", data)
        # scores are x100; the tiny model's near-constant regression outputs make Pearson move by ~1e-3 between the
        # training run's evaluation and `predict`'s packed batches (float32 summation order)
        assert result["scores"] == pytest.approx(expected, abs=1e-2), name
        assert result["score"] == pytest.approx(sum(expected.values()) / len(expected), abs=1e-2)
        task_numbers.append(result["score"])
    assert report["tasks"]["MNLI"]["dev"]["dev_mismatched"]["examples"] == 16
    assert set(report["tasks"]["MNLI"]["metrics"]) == {"dev_matched", "dev_mismatched"}
    assert set(report["tasks"]["CoLA"]["metrics"]) == {"dev"}
    assert report["average"] == pytest.approx(sum(task_numbers) / 4)
    assert sorted(p.name for p in out.iterdir()) == ["CoLA", "MNLI", "MRPC", "STS-B", "glue.json", "glue.md",
                                                     "glue_config.json"]

    assert main(argv) == 2  # the run is there: replacing it needs --overwrite
    assert "already holds files (another run?); pass --resume to continue it or --overwrite" in capsys.readouterr().err
    assert main([*argv, "--tasks", "cola", "--overwrite"]) == 0
    report = json.loads((out / "glue.json").read_text())
    assert list(report["tasks"]) == ["CoLA"] and report["skipped"] == {}
    assert report["average"] == report["tasks"]["CoLA"]["score"]

    # --run-config repeats the recorded run (its own settings, the model, the fine-tuning of every task, not its
    # --overwrite); options given beside it override them
    import bertforge.finetune.glue as glue_module

    seen = []
    monkeypatch.setattr(glue_module, "glue", lambda **settings: seen.append(settings) or {"table": "", "skipped": {}})
    assert main(["glue", "--run-config", str(out / "glue_config.json"), "--out", str(tmp_path / "again"),
                 "--lr", "2e-3"]) == 0
    (again,) = seen
    assert (again["model"], again["data_dir"], again["tasks"], again["max_train_examples"]) == (
        report["settings"]["model"], str(data), ["cola"], 24)
    assert (again["lr"], again["seed"], again["max_length"], again["out"]) == (2e-3, 3, 32, str(tmp_path / "again"))
    assert "overwrite" not in again and "resume" not in again


def test_resume_of_a_directory_without_a_glue_run_says_so_in_one_line(tmp_path, capsys):
    """`glue --resume --out DIR` with no glue_config.json in DIR: the missing options, and where --resume looked."""
    assert main(["glue", "--resume", "--out", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing required option(s): --model, --data-dir" in err
    assert f"(--resume found no glue_config.json in {tmp_path / 'nothing'} to take them from)" in err
    assert not (tmp_path / "nothing").exists()


def test_glue_with_adapters_trains_and_scores_each_task_through_them(tmp_path, tiny_model, capsys):
    data = write_glue(tmp_path / "data", ["MRPC"], n_train=16, n_dev=8)
    out = tmp_path / "glue"
    assert main(["glue", "--model", str(tiny_model), "--data-dir", str(data), "--out", str(out), "--epochs", "1",
                 "--batch-size", "8", "--lr", "1e-3", "--max-length", "32", "--no-progress", "--lora-rank", "2",
                 "--lora-alpha", "4", "--lora-dropout", "0.1", "--lora-targets", "query", "value", "ffn_out"]) == 0
    capsys.readouterr()
    model = out / "MRPC" / "model"
    assert (model / "adapter_config.json").is_file() and not (model / "model.safetensors").exists()
    report = json.loads((out / "glue.json").read_text())
    assert report["settings"]["finetune"]["lora_rank"] == 2
    assert set(report["tasks"]["MRPC"]["scores"]) == {"f1", "accuracy"}  # scored through the adapter directory
