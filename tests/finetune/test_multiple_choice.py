"""`finetune --task multiple-choice` (`bertforge.finetune.multiple_choice`): SWAG's rows and other layouts, the
refusals naming file, row and column, the families it refuses, and a fine-tuned model that `transformers`'
AutoModelForMultipleChoice loads with bertforge's logits."""

from __future__ import annotations

import json
import random

import pytest
import torch

from bertforge import AutoConfig, BertforgeError, BertModel
from bertforge.finetune import evaluate, finetune, predict
from bertforge.finetune.config import DataOptions
from bertforge.finetune.features import collate
from bertforge.finetune.multiple_choice import encode_choices, read_choices, require_multiple_choice
from bertforge.tokenizer import Tokenizer
from tests.finetune.conftest import vocabulary
from tests.helpers import tiny_config, write_uncased_tokenizer

NAMES = ("john", "mary", "peter")
CITIES = ("paris", "london", "berlin", "amsterdam")
GOOD, BAD = ("good", "great", "fun"), ("bad", "awful", "boring")


def swag_rows(n: int, seed: int = 0) -> list[dict]:
    """SWAG's columns (with its other ones, which are not read): the right ending is the city of sent1, and the
    only one that says a good word (what a tiny model learns in a few steps)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        who, city = NAMES[i % 3], rng.choice(CITIES)
        endings = [f"{c} , it was {rng.choice(BAD)}" for c in CITIES if c != city]
        rng.shuffle(endings)
        label = rng.randrange(4)
        endings.insert(label, f"{city} , it was {rng.choice(GOOD)}")
        rows.append({"video-id": f"v{i}", "fold-ind": str(i), "sent1": f"{who} lives in {city} .",
                     "sent2": f"{who} visited", **{f"ending{k}": endings[k] for k in range(4)}, "label": label})
    return rows


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def write_csv(path, header, rows):
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)
    return path


def test_swag_rows_pair_sent1_with_sent2_and_each_ending(tmp_path):
    rows = swag_rows(3)
    header = list(rows[0])
    path = write_csv(tmp_path / "swag.csv", header, [[r[c] for c in header] for r in rows])
    examples = read_choices(str(path), DataOptions(), labelled=True)
    assert [e.line for e in examples] == [2, 3, 4]
    first = examples[0]
    assert first.context == rows[0]["sent1"] and first.label == rows[0]["label"]
    assert first.choices == [f"{rows[0]['sent2']} {rows[0][f'ending{k}']}" for k in range(4)]
    assert [e.choices for e in read_choices(str(write_jsonl(tmp_path / "swag.jsonl", rows)), DataOptions(), True)] == [
        e.choices for e in examples]


def test_other_layouts(tmp_path):
    """--text-column and --choice-columns name the columns (a prefix with --text-pair-column); a `choices` column
    holding a list is found by itself; without a header the columns are indices; unlabelled rows predict."""
    path = write_csv(tmp_path / "q.csv", ["question", "a", "b", "c", "answer"],
                     [["where does john live ?", "paris", "london", "berlin", "1"]])
    opts = DataOptions(text_column="question", choice_columns=["a", "b", "c"], label_column="answer")
    (example,) = read_choices(str(path), opts, True)
    assert (example.context, example.choices, example.label) == ("where does john live ?", ["paris", "london", "berlin"], 1)
    (prefixed,) = read_choices(str(path), DataOptions(text_column="question", text_pair_column="a",
                                                      choice_columns=["b", "c"], label_column="answer"), True)
    assert prefixed.choices == ["paris london", "paris berlin"]
    listed = write_jsonl(tmp_path / "list.jsonl", [{"context": "john lives in paris .", "choices": ["paris", "berlin"],
                                                    "label": 0}])
    (example,) = read_choices(str(listed), DataOptions(), True)
    assert (example.context, example.choices, example.label) == ("john lives in paris .", ["paris", "berlin"], 0)
    bare = write_csv(tmp_path / "bare.csv", None, [["1", "john lives in paris .", "paris", "berlin"]])
    (example,) = read_choices(str(bare), DataOptions(no_header=True, text_column="1", choice_columns=["2", "3"],
                                                     label_column="0"), True)
    assert (example.choices, example.label) == (["paris", "berlin"], 1)
    rows = [{k: v for k, v in r.items() if k != "label"} for r in swag_rows(2)]
    assert [e.label for e in read_choices(rows, DataOptions(), labelled=False)] == [None, None]  # rows in memory


def _bad(rows):
    return [dict(r) for r in rows]


@pytest.mark.parametrize("change, message", [
    (lambda rows: [rows[0], {k: v for k, v in rows[1].items() if k != "ending3"}],
     r"bad.jsonl:2: no column 'ending3' \(columns: "),
    (lambda rows: [rows[0], {**rows[1], "label": 4}], r"bad.jsonl:2: label 4 \(column 'label'\) is out of range for 4 "
                                                       r"choices \(0 to 3\)"),
    (lambda rows: [rows[0], {**rows[1], "label": -1}], r"bad.jsonl:2: label -1 .* out of range"),
    (lambda rows: [rows[0], {**rows[1], "label": "second"}], r"bad.jsonl:2: label 'second' \(column 'label'\) is not "
                                                              r"the index of a choice \(0 to 3\)"),
    (lambda rows: [rows[0], {k: v for k, v in rows[1].items() if k != "label"}], r"bad.jsonl:2: no label \(column 'label'\)"),
    (lambda rows: [rows[0], {**rows[1], "ending2": ""}], r"bad.jsonl:2: column 'ending2' is empty"),
    (lambda rows: [{k: v for k, v in r.items() if k != "sent1"} for r in rows],
     r"bad.jsonl: name the context's column with --text-column"),
    (lambda rows: [{"context": "c", "choices": ["a", "b", "c"], "label": 0}, {"context": "c", "choices": ["a", "b"], "label": 0}],
     r"bad.jsonl:2: 2 choices, but line 1 has 3 \(every example of a file needs the same number of choices\)"),
    (lambda rows: [{"context": "c", "choices": ["a"], "label": 0}], r"bad.jsonl:1: 1 choice\(s\); a multiple-choice "
                                                                     r"example needs at least two"),
    (lambda rows: [{"context": "c", "options": ["a", "b"], "label": 0}], r"bad.jsonl: name the choices' columns with "
                                                                         r"--choice-columns"),
])
def test_bad_rows_are_refused_naming_file_row_and_column(tmp_path, change, message):
    path = write_jsonl(tmp_path / "bad.jsonl", change(_bad(swag_rows(2))))
    with pytest.raises(BertforgeError, match=message):
        read_choices(str(path), DataOptions(), labelled=True)


def test_a_csv_missing_a_choice_column_is_refused(tmp_path):
    path = write_csv(tmp_path / "q.csv", ["question", "a", "b", "label"], [["q", "x", "y", "0"]])
    with pytest.raises(BertforgeError, match=r"q.csv:2: no column 'c' \(columns: question, a, b, label\)"):
        read_choices(str(path), DataOptions(text_column="question", choice_columns=["a", "b", "c"]), True)


@pytest.mark.parametrize("columns", [[], ["a", "a"], ["a", ""]])
def test_choice_columns_must_be_distinct_names(columns):
    with pytest.raises(BertforgeError, match="choice_columns must be distinct column names"):
        DataOptions(choice_columns=columns).validate()


def test_features_hold_each_choice_as_a_pair(tiny_model):
    tokenizer = Tokenizer.from_pretrained(tiny_model)
    examples = read_choices(swag_rows(2), DataOptions(), True)
    features = encode_choices(tokenizer, examples, 32, labelled=True)
    assert [len(f["input_ids"]) for f in features] == [4, 4] and features[0]["labels"] == examples[0].label
    alone = tokenizer(examples[0].context, examples[0].choices[2], truncation=True, max_length=32)
    assert features[0]["input_ids"][2] == alone["input_ids"] and features[0]["token_type_ids"][2] == alone["token_type_ids"]
    batch = collate(features, tokenizer.pad_token_id)
    assert batch["input_ids"].shape[:2] == (2, 4) and batch["labels"].tolist() == [e.label for e in examples]


@pytest.mark.parametrize("model_type", ["nomic_bert", "gte", "eurobert", "jina_embeddings_v3"])
def test_families_without_a_transformers_class_are_refused(model_type):
    config = AutoConfig.for_model(model_type, vocab_size=100, pad_token_id=0)
    with pytest.raises(BertforgeError, match=r"train.csv: multiple choice is not available for .* transformers has no "
                                             r"\w+ForMultipleChoice"):
        require_multiple_choice(config, "train.csv")
    require_multiple_choice(AutoConfig.for_model("roberta", vocab_size=100), "train.csv")  # has one: no error


def test_finetune_refuses_such_a_family_before_writing(tmp_path):
    vocab = vocabulary()
    model = write_uncased_tokenizer(tmp_path / "nomic", vocab)
    BertModel(AutoConfig.for_model("nomic_bert", **{**dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=64), "vocab_size": len(vocab),
                                                    "pad_token_id": 0})).save_pretrained(model)
    train = write_jsonl(tmp_path / "train.jsonl", swag_rows(4))
    with pytest.raises(BertforgeError, match="train.jsonl: multiple choice is not available for NomicBERT models"):
        finetune(task="multiple-choice", model=str(model), train=str(train), dev=str(train), out=str(tmp_path / "out"),
                 progress=False)
    assert not (tmp_path / "out").exists()


def _transformers_logits(directory, features, pad_token_id):
    import transformers

    reference = transformers.AutoModelForMultipleChoice.from_pretrained(directory).eval()
    batch = collate(features, pad_token_id)
    with torch.no_grad():
        return reference(**batch).logits, batch


def test_a_fine_tuned_model_scores_accuracy_and_loads_in_transformers(tiny_model, tmp_path):
    """A short run on generated SWAG rows: the dev accuracy is computed (and is `evaluate`'s, and agrees with
    `predict`'s choices), and `transformers`' AutoModelForMultipleChoice loads the written model with no missing
    keys and bertforge's logits."""
    import transformers

    from bertforge import AutoModelForMultipleChoice

    train = write_jsonl(tmp_path / "train.jsonl", swag_rows(24))
    dev_rows = swag_rows(8, seed=1)
    dev = write_jsonl(tmp_path / "dev.jsonl", dev_rows)
    summary = finetune(task="multiple-choice", model=str(tiny_model), train=str(train), dev=str(dev),
                       out=str(tmp_path / "out"), epochs=2, batch_size=4, lr=1e-3, warmup_ratio=0.0, progress=False)
    assert summary["main_metric"] == "accuracy" and summary["metrics"]["accuracy"] >= 0.75  # chance: 0.25
    model = tmp_path / "out" / "model"
    assert json.loads((model / "config.json").read_text())["architectures"] == ["BertForMultipleChoice"]
    records = predict("multiple-choice", str(model), str(dev))
    right = sum(r["label"] == row["label"] for r, row in zip(records, dev_rows)) / len(dev_rows)
    assert evaluate("multiple-choice", str(model), str(dev))["accuracy"] == summary["metrics"]["accuracy"] == right
    assert all(abs(sum(r["probabilities"]) - 1) < 1e-6 and r["text"] == r["choices"][r["label"]] for r in records)

    _, info = transformers.AutoModelForMultipleChoice.from_pretrained(model, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    tokenizer = Tokenizer.from_pretrained(model)
    features = encode_choices(tokenizer, read_choices(str(dev), DataOptions(), True), 128, labelled=False)
    theirs, batch = _transformers_logits(model, features, tokenizer.pad_token_id)
    with torch.no_grad():
        ours = AutoModelForMultipleChoice.from_pretrained(model).eval()(**batch).logits
    # the tiny model's logits lie close together: the same to 1e-5, and to a thousandth of their spread
    assert ours.shape == (8, 4) and (ours - theirs).abs().max().item() <= min(1e-5, 1e-3 * float(theirs.std()))


def test_the_commands_train_predict_and_evaluate_other_columns(tiny_model, tmp_path, capsys):
    """`finetune --task multiple-choice --choice-columns ...` on a CSV of other column names, then `predict` (JSONL
    records) and `evaluate` with the same options: the run's dev accuracy."""
    from bertforge.cli import main

    def write(path, rows):
        return write_csv(path, ["question", "first", "second", "third", "fourth", "answer"],
                         [[r["sent1"], *(r[f"ending{k}"] for k in range(4)), r["label"]] for r in rows])

    train, dev = write(tmp_path / "train.csv", swag_rows(12)), write(tmp_path / "dev.csv", swag_rows(4, seed=1))
    columns = ["--text-column", "question", "--choice-columns", "first", "second", "third", "fourth",
               "--label-column", "answer", "--no-progress"]
    out = tmp_path / "run"
    assert main(["finetune", "--task", "multiple-choice", "--model", str(tiny_model), "--train", str(train),
                 "--dev", str(dev), "--out", str(out), "--epochs", "1", "--batch-size", "4", *columns]) == 0
    run = json.loads((out / "eval.json").read_text())
    assert run["main_metric"] == "accuracy"
    assert json.loads((out / "finetune_config.json").read_text())["choice_columns"] == ["first", "second", "third", "fourth"]
    predictions = tmp_path / "predictions.jsonl"
    assert main(["predict", "--task", "multiple-choice", "--model", str(out / "model"), "--input", str(dev), "--out",
                 str(predictions), *columns]) == 0
    records = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert [len(r["choices"]) for r in records] == [4] * 4
    capsys.readouterr()
    assert main(["evaluate", "--task", "multiple-choice", "--model", str(out / "model"), "--input", str(dev),
                 *columns]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == run["metrics"]["accuracy"]


def test_the_memory_estimate_counts_every_choice(tiny_model):
    from bertforge.finetune.multiple_choice import MultipleChoice

    examples = read_choices(swag_rows(2), DataOptions(), True)
    assert MultipleChoice().sequences_per_example(examples, None) == 4
    assert MultipleChoice().max_length(DataOptions(), tiny_config()) == 64  # 128 at most the positions
