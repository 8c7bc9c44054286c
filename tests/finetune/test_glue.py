"""`bertforge.finetune.glue`: every GLUE file format read into the right columns and labels, the table and its
average, missing tasks skipped, malformed files and bad settings refused before anything is written. The GLUE
directories are tiny ones written here, in the layout and columns of GLUE's own download. (The command end to end,
its scores against scikit-learn / scipy: tests/commands/test_glue.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.finetune.glue import (GLUE_TASKS, find_tasks, glue, glue_average, glue_table, prepare_task, read_split,
                                     task_named)

from .conftest import NEGATIVE, POSITIVE

# ------------------------------------------------------------------------------------------ a GLUE directory

HEADERS = {
    "SST-2": ["sentence", "label"],
    "MRPC": ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"],
    "STS-B": ["index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1", "sentence2",
              "score"],
    "QQP": ["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
    "MNLI": ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
             "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"],
    "QNLI": ["index", "question", "sentence", "label"],
    "RTE": ["index", "sentence1", "sentence2", "label"],
}
LABELS = {"CoLA": ["0", "1"], "SST-2": ["0", "1"], "MRPC": ["0", "1"], "QQP": ["0", "1"],
          "MNLI": ["contradiction", "entailment", "neutral"], "QNLI": ["entailment", "not_entailment"],
          "RTE": ["entailment", "not_entailment"]}


def example(task: str, i: int) -> tuple[str, str | None, str]:
    """The i-th (text, second text, label) of a task's synthetic file."""
    positive = i % 2 == 1
    text = (POSITIVE if positive else NEGATIVE)[(i // 2) % len(POSITIVE)]
    if i % 5 == 0:
        text += ' , "great" ?'  # GLUE TSV keeps quotes as text
    pair = None if task in ("CoLA", "SST-2") else NEGATIVE[(i * 7) % len(NEGATIVE)]
    if task == "STS-B":
        return text, pair, f"{(i * 37 % 26) / 5:.3f}"  # 0.000 ... 5.000, written as GLUE does
    labels = LABELS[task]
    return text, pair, labels[i % len(labels)] if task == "MNLI" else labels[int(positive)]


def row(task: str, i: int, dev_extra: bool = False) -> str:
    text, pair, label = example(task, i)
    cells = {
        "CoLA": ["gj04", label, "" if label == "1" else "*", text],
        "SST-2": [text, label],
        "MRPC": [label, str(1000 + i), str(2000 + i), text, pair],
        "STS-B": [str(i), "main-captions", "MSRvid", "2012test", f"{i:04d}", "none", "none", text, pair, label],
        "QQP": [str(i), str(2 * i), str(2 * i + 1), text, pair, label],
        "MNLI": [str(i), str(31193 + i), f"{31193 + i}n", "government", f"( {text} )", f"( {pair} )",
                 f"(ROOT {text})", f"(ROOT {pair})", text, pair, label] + ([label] * 4 if dev_extra else []) + [label],
        "QNLI": [str(i), text, pair, label],
        "RTE": [str(i), text, pair, label],
    }[task]
    return "\t".join(cells)


def write_task(root: Path, task: str, directory: str | None = None, n_train: int = 24, n_dev: int = 12) -> Path:
    """One task's directory in GLUE's layout: train.tsv and dev.tsv (MNLI: dev_matched and dev_mismatched)."""
    folder = root / (directory or task)
    folder.mkdir(parents=True, exist_ok=True)
    devs = ["dev_matched", "dev_mismatched"] if task == "MNLI" else ["dev"]
    for stem, start, count in [("train", 0, n_train)] + [(d, 100 + 50 * k, n_dev) for k, d in enumerate(devs)]:
        header = HEADERS.get(task)
        if header and task == "MNLI" and stem != "train":
            header = header[:-1] + ["label2", "label3", "label4", "label5", "gold_label"]
        rows = [row(task, i, stem != "train") for i in range(start, start + count)]
        lines = (["\t".join(header)] if header else []) + rows
        (folder / f"{stem}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def write_glue(root: Path, tasks=tuple(t.name for t in GLUE_TASKS), **sizes) -> Path:
    for task in tasks:
        write_task(root, task, **sizes)
    return root


# ------------------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("task", [t.name for t in GLUE_TASKS])
def test_each_format_reads_into_text_pair_and_label(task, tmp_path):
    folder = write_task(tmp_path, task)
    glue_task = task_named(task)
    examples = read_split(glue_task, folder / "train.tsv")
    assert [(e.text, e.text_pair, e.label) for e in examples] == [example(task, i) for i in range(24)]
    assert examples[0].line == (1 if task == "CoLA" else 2)  # CoLA has no header row
    assert examples[5].text.endswith('"great" ?')
    for k, (stem, _) in enumerate(glue_task.dev_splits):
        dev = read_split(glue_task, folder / f"{stem}.tsv")
        start = 100 + 50 * k
        assert [(e.text, e.text_pair, e.label) for e in dev] == [example(task, i) for i in range(start, start + 12)]
    assert "label" not in {e.text for e in examples} and all(e.label for e in examples)


def test_mnli_dev_reads_gold_label_past_five_annotator_labels(tmp_path):
    folder = write_task(tmp_path, "MNLI")
    lines = (folder / "dev_mismatched.tsv").read_text().splitlines()
    assert lines[0].split("\t")[-6:] == ["label1", "label2", "label3", "label4", "label5", "gold_label"]
    cells = lines[1].split("\t")
    cells[-1] = "neutral" if cells[-1] != "neutral" else "entailment"  # gold differs from label1..5
    lines[1] = "\t".join(cells)
    (folder / "dev_mismatched.tsv").write_text("\n".join(lines) + "\n")
    examples = read_split(task_named("MNLI"), folder / "dev_mismatched.tsv")
    assert examples[0].label == cells[-1] and examples[0].text_pair == example("MNLI", 150)[1]


def test_task_names_and_directories_in_any_case(tmp_path):
    assert [task_named(n).name for n in ("sst2", "sts-b", "cola", "Mnli")] == ["SST-2", "STS-B", "CoLA", "MNLI"]
    with pytest.raises(BertforgeError, match="unknown GLUE task 'WNLI'.*CoLA, SST-2"):
        task_named("WNLI")
    for task, directory in [("CoLA", "cola"), ("SST-2", "sst2"), ("STS-B", "sts-b"), ("MNLI", "mnli"), ("RTE", "RTE")]:
        write_task(tmp_path, task, directory)
    found, skipped = find_tasks(tmp_path)
    assert [(t.name, d.name) for t, d in found] == [("CoLA", "cola"), ("SST-2", "sst2"), ("STS-B", "sts-b"),
                                                    ("MNLI", "mnli"), ("RTE", "RTE")]
    assert skipped == {"MRPC": "no MRPC/ directory", "QQP": "no QQP/ directory", "QNLI": "no QNLI/ directory"}


def test_missing_tasks_are_skipped_unless_asked_for(tmp_path):
    write_task(tmp_path, "RTE")
    write_task(tmp_path, "MNLI")
    (tmp_path / "MNLI" / "dev_mismatched.tsv").unlink()
    found, skipped = find_tasks(tmp_path)
    assert [t.name for t, _ in found] == ["RTE"]
    assert skipped["MNLI"] == "MNLI/ has no dev_mismatched.tsv" and len(skipped) == 7
    assert [t.name for t, _ in find_tasks(tmp_path, ["rte"])[0]] == ["RTE"]
    with pytest.raises(BertforgeError, match="MNLI/ has no dev_mismatched.tsv .the task MNLI was asked for"):
        find_tasks(tmp_path, ["RTE", "MNLI"])
    with pytest.raises(BertforgeError, match="no GLUE task found"):
        find_tasks(tmp_path / "MNLI")
    with pytest.raises(BertforgeError, match="no such directory"):
        find_tasks(tmp_path / "nowhere")


def test_training_sample_is_seeded_and_written_for_finetune(tmp_path):
    write_glue(tmp_path / "data", ["STS-B", "MNLI"], n_train=40)
    for name in ("STS-B", "MNLI"):
        task = task_named(name)
        runs = [prepare_task(task, tmp_path / "data" / name, tmp_path / f"work{k}", 10, seed) for k, seed in
                enumerate((7, 7, 8))]
        first, again, other = ([json.loads(line) for line in p.train.read_text().splitlines()] for p in runs)
        assert runs[0].train_examples == 10 and runs[0].train_available == 40
        assert first == again and first != other
        originals = [example(name, i) for i in range(40)]
        for record in first:
            assert any(record["text"] == t and record["text_pair"] == p for t, p, _ in originals)
        assert [d.stem for d in runs[0].devs] == (["dev_matched", "dev_mismatched"] if name == "MNLI" else ["dev"])
        assert all(d.examples == 12 for d in runs[0].devs)
    assert {record["label"] for record in first} <= set(LABELS["MNLI"])  # MNLI's labels stay strings
    stsb = prepare_task(task_named("STS-B"), tmp_path / "data" / "STS-B", tmp_path / "work9", None, 0)
    labels = [json.loads(line)["label"] for line in stsb.train.read_text().splitlines()]
    assert labels == [float(example("STS-B", i)[2]) for i in range(40)]  # floats: finetune regresses


# ------------------------------------------------------------------------------------------ malformed input


def corrupt(path: Path, line: int, new: str | None) -> None:
    lines = path.read_text().splitlines()
    lines[line - 1] = new if new is not None else lines[line - 1] + "\textra field"
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("task, file, line, new, message", [
    ("RTE", "dev.tsv", 5, None, r"RTE/dev.tsv:5: 5 fields, but the header has 4"),
    ("CoLA", "train.tsv", 3, "gj04\t1\tonly three", r"CoLA/train.tsv:3: 3 fields, but the first row has 4"),
    ("STS-B", "train.tsv", 4, "\t".join(["2"] + ["x"] * 8 + ["high"]),
     r"STS-B/train.tsv:4: the STS-B score 'high' is not a number"),
    ("QNLI", "dev.tsv", 2, "100\tq\ts\tmaybe", r"QNLI/dev.tsv:2: label 'maybe' is not among the training labels"),
    ("SST-2", "train.tsv", 1, "text\tlabel", r"SST-2/train.tsv:1: no column 'sentence' in the header"),
    ("MRPC", "dev.tsv", 3, "\t1001\t2001\ta\tb", r"MRPC/dev.tsv:3: the label is empty"),
])
def test_malformed_files_are_refused_naming_file_and_line_before_anything_is_written(
    task, file, line, new, message, tmp_path, tiny_model
):
    data = write_glue(tmp_path / "data", ["CoLA", task])
    corrupt(data / task / file, line, new)
    out = tmp_path / "out"
    with pytest.raises(BertforgeError, match=message):
        glue(tiny_model, data, out, epochs=1, device="cpu", progress=False)
    assert not out.exists()  # CoLA, read first and fine, was not trained either


def test_bad_settings_are_refused(tmp_path, tiny_model):
    data = write_glue(tmp_path / "data", ["RTE"])
    for kwargs, message in [({"lr": 2.0}, "lr must be"), ({"max_train_examples": 1}, "max_train_examples must be"),
                            ({"tasks": ["RTE", "XNLI"]}, "unknown GLUE task 'XNLI'"),
                            ({"metric": "f1"}, "glue sets metric for each task itself"),
                            ({"no_such_setting": 1}, "bad settings")]:
        with pytest.raises(BertforgeError, match=message):
            glue(tiny_model, data, tmp_path / "out", **kwargs)
    with pytest.raises(BertforgeError, match="no-model: no such config file"):
        glue(tmp_path / "no-model", data, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------ the output directory


def previous_run(out: Path) -> dict[str, str]:
    """A GLUE run's files in `out` (as an earlier run left them); returns their contents by path."""
    (out / "CoLA").mkdir(parents=True)
    files = {"glue_config.json": '{"before": true}\n', "glue.md": "old table\n", "CoLA/eval.json": "{}\n"}
    for name, text in files.items():
        (out / name).write_text(text)
    return files


def test_the_output_directory_is_refused_when_it_holds_something_else_or_a_run(tmp_path, tiny_model):
    data = write_glue(tmp_path / "data", ["RTE"])
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    for overwrite in (False, True):  # --overwrite or not, a directory of something else is never replaced
        with pytest.raises(BertforgeError, match="already holds files|not a bertforge GLUE run"):
            glue(tiny_model, data, foreign, overwrite=overwrite, device="cpu")
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    out = tmp_path / "out"
    files = previous_run(out)
    with pytest.raises(BertforgeError, match="already holds files .*; pass --resume to continue it or --overwrite"):
        glue(tiny_model, data, out, device="cpu")
    assert {name: (out / name).read_text() for name in files} == files


def test_overwrite_puts_the_previous_run_back_when_the_new_one_fails_before_its_first_task(
    tmp_path, tiny_model, monkeypatch
):
    data = write_glue(tmp_path / "data", ["RTE", "CoLA"])
    out = tmp_path / "out"
    files = previous_run(out)

    def fails(*args, **kwargs):
        assert not (out / "glue.md").exists() and (out / ".replaced-run" / "glue.md").is_file()  # set aside
        raise BertforgeError("the first task failed")

    monkeypatch.setattr("bertforge.finetune.glue.run_task", fails)
    with pytest.raises(BertforgeError, match="the first task failed"):
        glue(tiny_model, data, out, overwrite=True, device="cpu", progress=False)
    assert {name: (out / name).read_text() for name in files} == files
    assert not (out / ".replaced-run").exists()


def test_overwrite_drops_the_previous_run_once_the_first_task_is_done(tmp_path, tiny_model, monkeypatch):
    data = write_glue(tmp_path / "data", ["CoLA", "RTE"])
    out = tmp_path / "out"
    previous_run(out)
    done = []

    def one_task(prepared, template, target, rt=None):
        if done:  # the second task: the first one's run is worth keeping, the previous GLUE run has gone
            assert not (out / ".replaced-run").exists() and not (out / "CoLA" / "eval.json").exists()
            raise BertforgeError("the second task failed")
        done.append(prepared.task.name)
        assert (out / ".replaced-run" / "CoLA" / "eval.json").is_file()

    monkeypatch.setattr("bertforge.finetune.glue.run_task", one_task)
    with pytest.raises(BertforgeError, match="the second task failed"):
        glue(tiny_model, data, out, overwrite=True, device="cpu", progress=False)
    assert done == ["CoLA"] and json.loads((out / "glue_config.json").read_text())["overwrite"] is True
    assert not (out / "glue.md").exists()  # the previous run's table went with it


def test_a_stopped_run_resumes_where_it_stopped(tmp_path, tiny_model, monkeypatch, capsys):
    """Stopped in its second task (RTE) after its first checkpoint: `resume=True` reads the first task's entry back without
    training it again, resumes RTE from its checkpoint, and ends with the uninterrupted run's scores exactly;
    `bertforge glue --resume --out RUN` alone then finds every task done and prints the same table."""
    from bertforge.cli import main
    from bertforge.training.step import TrainStep

    data = write_glue(tmp_path / "data", ["CoLA", "RTE"])
    run = dict(device="cpu", progress=False, epochs=2, batch_size=8, seed=1, save_every=1)
    reference = glue(tiny_model, data, tmp_path / "reference", **run)
    steps, real = [], TrainStep.run

    def counted(self, *args, **kwargs):
        outcome = real(self, *args, **kwargs)
        steps.append(self.step)
        if stop_at and len(steps) == stop_at:
            raise BertforgeError("stopped")
        return outcome

    monkeypatch.setattr(TrainStep, "run", counted)
    stop_at = 6 + 2  # CoLA's 6 steps (24 examples, batches of 8, 2 epochs), then 2 of RTE's
    out = tmp_path / "out"
    with pytest.raises(BertforgeError, match="stopped"):
        glue(tiny_model, data, out, **run)
    assert (out / "CoLA" / "glue_task.json").is_file() and not (out / "RTE" / "glue_task.json").exists()
    with pytest.raises(BertforgeError, match="already holds files .* pass --resume"):
        glue(tiny_model, data, out, **run)
    with pytest.raises(BertforgeError, match=r"settings that differ from the run in \S+: finetune.lr: 5e-05 -> 0.001$"):
        glue(tiny_model, data, out, **run, lr=1e-3, resume=True)
    steps.clear()
    stop_at = 0
    resumed = glue(tiny_model, data, out, **run, resume=True)
    assert steps == [2, 3, 4, 5, 6]  # RTE's after its checkpoint of step 1 (step 2 stopped before its own was saved)
    for name in ("CoLA", "RTE"):
        assert resumed["tasks"][name]["metrics"] == reference["tasks"][name]["metrics"]
    assert resumed["average"] == reference["average"] and resumed["table"] == reference["table"]
    capsys.readouterr()
    assert main(["glue", "--resume", "--out", str(out)]) == 0 and steps == [2, 3, 4, 5, 6]  # nothing trained
    assert capsys.readouterr().out.startswith(resumed["table"])


# ------------------------------------------------------------------------------------------ the table


def test_table_and_average_by_hand():
    scores = {"MNLI": {"accuracy_m": 70.0, "accuracy_mm": 72.0}, "CoLA": {"mcc": 40.0},
              "MRPC": {"f1": 90.0, "accuracy": 80.0}, "STS-B": {"pearson": 85.04, "spearman": 84.96}}
    # one number per task: 71, 40, 85, 85, averaged
    assert glue_average(scores) == pytest.approx((71 + 40 + 85 + 85) / 4)
    assert glue_table("mini", scores) == (
        "| model | CoLA MCC | MRPC F1/acc | STS-B Pearson/Spearman | MNLI m/mm acc | average |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n"
        "| mini | 40.0 | 90.0/80.0 | 85.0/85.0 | 70.0/72.0 | 70.2 |\n"
    )
    with pytest.raises(BertforgeError):
        glue_average({})


def test_a_resume_after_the_data_changed_names_the_tasks_file(tmp_path, tiny_model, monkeypatch):
    """Issue 46: `glue --resume` after a task's train.tsv changed named the temporary JSONL files glue prepares
    (train.jsonl) instead of the task and its file."""
    from bertforge.training.step import TrainStep

    data = write_glue(tmp_path / "data", ["RTE"])
    run = dict(device="cpu", progress=False, epochs=1, batch_size=8, seed=1, save_every=1)
    real = TrainStep.run

    def stop_after_two(self, *args, **kwargs):
        outcome = real(self, *args, **kwargs)
        if self.step == 2:
            raise BertforgeError("stopped")
        return outcome

    monkeypatch.setattr(TrainStep, "run", stop_after_two)
    out = tmp_path / "out"
    with pytest.raises(BertforgeError, match="stopped"):
        glue(tiny_model, data, out, **run)
    train = data / "RTE" / "train.tsv"
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    train.write_text("".join(lines[:1] + lines[2:] + lines[1:2]), encoding="utf-8")  # the same rows, reordered
    with pytest.raises(BertforgeError) as err:
        glue(tiny_model, data, out, **run, resume=True)
    message = str(err.value)
    assert message.startswith("cannot resume GLUE task RTE: its data differs") and str(train) in message, message
    assert ".jsonl" not in message and "bertforge-glue-" not in message
