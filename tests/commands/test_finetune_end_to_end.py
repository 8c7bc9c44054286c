"""`bertforge finetune` (`bertforge.commands.finetune`) end to end: tiny fine-tuning runs through the CLI for every
task: the output directory, transformers loading the model, evaluate and predict, reproducibility, early stopping,
and the one-line errors for bad input."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge.cli import main
from tests.finetune.conftest import write_conll, write_sentiment, write_squad

from .cmd_helpers import FAST, finetune

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py

transformers = pytest.importorskip("transformers")


def check_run_directory(out: Path, hf_class: str, ours_class: type, inputs: dict) -> None:
    assert {p.name for p in out.iterdir()} == {
        "model", "eval.json", "metrics.jsonl", "training_curve.png", "finetune_config.json", "tensorboard", "checkpoints"
    }
    assert (out / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(r["type"] == "eval" for r in records)
    reference = getattr(transformers, hf_class).from_pretrained(out / "model").eval()
    ours = ours_class.from_pretrained(out / "model").eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out / "model")
    batch = hf_tokenizer(**inputs, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs, mine = reference(**batch), ours(**batch)
    for name in ("logits", "start_logits"):
        if getattr(mine, name, None) is not None:
            assert torch.allclose(getattr(theirs, name), getattr(mine, name), atol=1e-5)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary directory left


def test_classification_end_to_end(tmp_path, tiny_model, capsys):
    train = write_sentiment(tmp_path / "train.tsv", 32)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / "runs" / "sst"
    summary = finetune(capsys, tiny_model, "classification", train, dev, out)
    assert summary["main_metric"] == "accuracy" and set(summary["metrics"]) >= {"accuracy", "f1", "macro_f1", "mcc"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "neg", "1": "pos"} and config["label2id"] == {"neg": 0, "pos": 1}
    assert config["architectures"] == ["BertForSequenceClassification"]
    check_run_directory(out, "BertForSequenceClassification", bertforge.BertForSequenceClassification,
                        {"text": ["good movie", "an awful plot of this film"]})

    assert main(["evaluate", "--task", "classification", "--model", str(out / "model"), "--input", str(dev),
                 "--no-progress"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["accuracy"] == pytest.approx(summary["metrics"]["accuracy"])

    new = tmp_path / "new.jsonl"
    new.write_text('{"text": "great fun"}\n{"text": "boring"}\n')
    predictions = tmp_path / "pred.jsonl"
    assert main(["predict", "--task", "classification", "--model", str(out / "model"), "--input", str(new),
                 "--out", str(predictions), "--no-progress"]) == 0
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [r["text"] for r in records] == ["great fun", "boring"]
    assert all(r["label"] in ("neg", "pos") and set(r["probabilities"]) == {"neg", "pos"} for r in records)


def test_sentence_pair_regression(tmp_path, tiny_model, capsys):
    rows = ["sentence1,sentence2,score"] + [f"good movie,{'great film' if i % 2 else 'bad plot'},{i % 5}.5"
                                           for i in range(16)]
    (tmp_path / "sts.csv").write_text("\n".join(rows) + "\n")
    out = tmp_path / "sts"
    summary = finetune(capsys, tiny_model, "classification", tmp_path / "sts.csv", tmp_path / "sts.csv", out,
                       "--label-column", "score")
    assert summary["main_metric"] == "pearson" and "spearman" in summary["metrics"]
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["num_labels"] == 1 and config["problem_type"] == "regression"
    check_run_directory(out, "BertForSequenceClassification", bertforge.BertForSequenceClassification,
                        {"text": ["good movie"], "text_pair": ["great film"]})


def test_finetuning_a_finetuned_classifier_for_other_labels_gets_a_new_head(tmp_path, tiny_model, capsys, caplog):
    """A checkpoint fine-tuned for two labels, fine-tuned again for regression: the encoder carries over, the
    [2, H] classifier is replaced by a new [1, H] one with a warning naming it."""
    first = tmp_path / "sst"
    write_sentiment(tmp_path / "train.tsv", 16)
    finetune(capsys, tiny_model, "classification", tmp_path / "train.tsv", tmp_path / "train.tsv", first)
    rows = ["sentence1,sentence2,score"] + [f"good movie,{'great film' if i % 2 else 'bad plot'},{i % 5}.5"
                                           for i in range(16)]
    (tmp_path / "sts.csv").write_text("\n".join(rows) + "\n")
    with caplog.at_level("WARNING", logger="bertforge"):
        summary = finetune(capsys, first / "model", "classification", tmp_path / "sts.csv", tmp_path / "sts.csv",
                           tmp_path / "sts", "--label-column", "score")
    assert summary["main_metric"] == "pearson"
    assert "another shape, newly initialised: classifier" in caplog.text
    assert json.loads((tmp_path / "sts" / "model" / "config.json").read_text())["num_labels"] == 1


def test_ner_end_to_end(tmp_path, tiny_model, capsys):
    train, dev = write_conll(tmp_path / "train.txt"), write_conll(tmp_path / "dev.txt", copies=1)
    out = tmp_path / "ner"
    summary = finetune(capsys, tiny_model, "ner", train, dev, out)
    assert summary["main_metric"] == "f1" and set(summary["metrics"]["per_type"]) <= {"PER", "LOC", "ORG"}
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"]["0"] == "O" and set(config["label2id"]) == {"O", "B-PER", "B-LOC", "B-ORG", "I-ORG"}
    check_run_directory(out, "BertForTokenClassification", bertforge.BertForTokenClassification,
                        {"text": [["john", "lives", "in", "amsterdam"]], "is_split_into_words": True})

    new = tmp_path / "new.jsonl"
    new.write_text('{"text": "Mary lives in Amsterdam."}\n{"tokens": ["peter", "works"]}\n')
    predictions = tmp_path / "pred.jsonl"
    assert main(["predict", "--task", "ner", "--model", str(out / "model"), "--input", str(new),
                 "--out", str(predictions), "--no-progress"]) == 0
    first, second = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert first["tokens"] == ["Mary", "lives", "in", "Amsterdam", "."] and len(first["tags"]) == 5
    for entity in first["entities"]:
        assert first["text"][entity["char_start"] : entity["char_end"]] == entity["text"]
    assert second["tokens"] == ["peter", "works"] and len(second["tags"]) == 2


@pytest.mark.parametrize("version_2", [True, False])
def test_qa_end_to_end(tmp_path, tiny_model, capsys, version_2):
    data = write_squad(tmp_path / "squad.json", version_2=version_2)
    out = tmp_path / "qa"
    summary = finetune(capsys, tiny_model, "qa", data, data, out, "--max-length", "32", "--doc-stride", "8")
    assert summary["main_metric"] == "f1" and summary["metrics"]["total"] == (12 if version_2 else 6)
    assert ("NoAns_f1" in summary["metrics"]) == version_2
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["version_2_with_negative"] is version_2 and config["finetuning_task"] == "qa"
    check_run_directory(out, "BertForQuestionAnswering", bertforge.BertForQuestionAnswering,
                        {"text": ["where does john live ?"], "text_pair": ["john lives in paris ."]})
    predictions = tmp_path / "pred.jsonl"
    assert main(["predict", "--task", "qa", "--model", str(out / "model"), "--input", str(data),
                 "--out", str(predictions), "--max-length", "32", "--doc-stride", "8", "--no-progress"]) == 0
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    contexts = {q["id"]: p["context"] for p in json.loads(data.read_text())["data"][0]["paragraphs"] for q in p["qas"]}
    for r in records:
        assert r["answer"] == (contexts[r["id"]][r["start"] : r["end"]] if r["start"] >= 0 else "")


def test_rerun_from_saved_config_is_identical(tmp_path, tiny_model, capsys):
    train = write_sentiment(tmp_path / "train.tsv", 24)
    first = tmp_path / "first"
    finetune(capsys, tiny_model, "classification", train, train, first, "--seed", "7", "--grad-accum", "2")
    assert main(["finetune", "--run-config", str(first / "finetune_config.json"), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    for name in ("model/model.safetensors", "eval.json"):
        a, b = (first / name).read_bytes(), (tmp_path / "again" / name).read_bytes()
        if name == "eval.json":  # the wall time differs
            a, b = ({k: v for k, v in json.loads(x).items() if k != "train_seconds"} for x in (a, b))
        assert a == b
    saved = json.loads((first / "finetune_config.json").read_text())
    assert saved["seed"] == 7 and saved["grad_accum"] == 2 and Path(saved["train"]).is_absolute()
    assert json.loads((first / "eval.json").read_text())["train_steps"] == 2  # 3 batches of 8, 2 per step


def test_eval_every_and_early_stop(tmp_path, tiny_model, capsys):
    train = write_sentiment(tmp_path / "train.tsv", 32)
    summary = finetune(capsys, tiny_model, "classification", train, train, tmp_path / "run", "--epochs", "5",
                       "--lr", "1e-9", "--eval-every", "1", "--early-stop-patience", "2")
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evaluations = [r for r in records if r["type"] == "eval"]
    assert summary["stopped_early"] and len(evaluations) == 3  # the first, then two without improvement
    assert [r["step"] for r in evaluations] == [1, 2, 3] and summary["step"] == 1


def test_out_holding_a_run_is_refused_without_overwrite(tmp_path, tiny_model, capsys):
    train = write_sentiment(tmp_path / "train.tsv", 16)
    out = tmp_path / "run"
    finetune(capsys, tiny_model, "classification", train, train, out)
    before = (out / "eval.json").read_bytes()
    args = ["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train), "--dev",
            str(train), "--out", str(out), *FAST]
    assert main(args) == 2
    assert "already holds files (another run?); pass --resume to continue it or --overwrite" in capsys.readouterr().err
    assert (out / "eval.json").read_bytes() == before
    assert main([*args, "--overwrite"]) == 0
    capsys.readouterr()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert main([*args[:-len(FAST) - 2], "--out", str(tmp_path / "other"), "--overwrite", *FAST]) == 2
    assert "not a bertforge fine-tuning run" in capsys.readouterr().err
    # issue 46: a plain model directory as --out was told to pass --overwrite, which was then refused
    model_copy = tmp_path / "a-model"
    shutil.copytree(tiny_model, model_copy)
    assert main([*args[:-len(FAST) - 2], "--out", str(model_copy), *FAST]) == 2
    err = capsys.readouterr().err
    assert "not a bertforge fine-tuning run (a model?)" in err and "pass --overwrite" not in err, err


def bad_inputs(tmp_path: Path) -> list[tuple[str, list[str], str]]:
    """(task, files, expected message) for each kind of bad input."""
    good = write_sentiment(tmp_path / "good.tsv", 8)
    no_label = tmp_path / "no_label.tsv"
    no_label.write_text("sentence\tstars\ngood\t1\n")
    unseen = write_sentiment(tmp_path / "unseen.tsv", 4, labels=("neg", "meh"))
    empty = tmp_path / "empty.tsv"
    empty.write_text("")
    conll = write_conll(tmp_path / "ner.txt", copies=1)
    broken = tmp_path / "broken.txt"
    broken.write_text("john NN B-PER\nlives O\n")
    misc = tmp_path / "misc.txt"
    misc.write_text("john NN B-PER\nlives NN O\n\nthe DT O\neuro NN B-MISC\n")
    squad = write_squad(tmp_path / "squad.json")
    data = json.loads(squad.read_text())
    data["data"][0]["paragraphs"][2]["qas"][0]["answers"][0]["answer_start"] -= 2
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(data, indent=1))
    return [
        ("classification", [no_label, good], r"no_label.tsv:1: no column 'label'"),
        ("classification", [good, unseen], r"unseen.tsv:3: label 'meh' was not seen in training"),
        ("classification", [empty, good], r"empty.tsv: the file is empty"),
        ("ner", [conll, broken], r"broken.txt:2: 2 column\(s\), expected 3"),
        ("ner", [conll, misc], r"misc.txt:5: tag 'B-MISC' was not seen in training"),
        ("qa", [moved, squad], r"moved.json:\d+: question q4: answer 'london' does not match the context"),
    ]


def test_bad_input_fails_with_one_line_and_writes_nothing(tmp_path, tiny_model, capsys):
    import re

    for task, (train, dev), message in bad_inputs(tmp_path):
        out = tmp_path / "out"
        rc = main(["finetune", "--task", task, "--model", str(tiny_model), "--train", str(train), "--dev", str(dev),
                   "--out", str(out), "--max-length", "32", "--doc-stride", "8", *FAST])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert re.search(message, err), err
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_command_line_exit_code_and_single_line(tmp_path, tiny_model):
    """Through a real process: a missing label column gives exit status 2 and one line on stderr."""
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tstars\ngood\t1\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "bertforge", "finetune", "--task", "classification", "--model", str(tiny_model),
         "--train", str(data), "--dev", str(data), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"bertforge finetune: error: {data}:1: no column 'label' in the header (columns: sentence, stars)"
    ]


def test_header_less_tsv_with_column_indices(tmp_path, tiny_model, capsys):
    """CoLA's layout: source, label, original mark, sentence; no header row."""
    rows = [f"src\t{i % 2}\t\t{'good movie' if i % 2 else 'movie good the'}" for i in range(16)]
    (tmp_path / "cola.tsv").write_text("\n".join(rows) + "\n")
    summary = finetune(capsys, tiny_model, "classification", tmp_path / "cola.tsv", tmp_path / "cola.tsv",
                       tmp_path / "cola", "--no-header", "--text-column", "3", "--label-column", "1",
                       "--metric", "mcc")
    assert summary["main_metric"] == "mcc"
    assert json.loads((tmp_path / "cola" / "model" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}
    assert main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train",
                 str(tmp_path / "cola.tsv"), "--dev", str(tmp_path / "cola.tsv"), "--out", str(tmp_path / "x"),
                 "--no-header", "--text-column", "3", "--label-column", "1", "--metric", "pearson"]) == 2
    assert "--metric 'pearson' is not reported for classification" in capsys.readouterr().err


@pytest.mark.parametrize("setting", ["BERTFORGE_MALLOC=off", "BERTFORGE_LINEAR=onednnn"])
def test_a_misspelt_speed_setting_fails_in_one_line_leaving_nothing(tmp_path, tiny_model, capsys, monkeypatch, setting):
    name, value = setting.split("=")
    monkeypatch.setenv(name, value)
    train = write_sentiment(tmp_path / "train.tsv", 16)
    out = tmp_path / "runs" / "sst"
    rc = main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train),
               "--dev", str(train), "--out", str(out), *FAST])
    err = capsys.readouterr().err
    assert rc == 2 and f"{name} must be" in err and f"'{value}'" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())
