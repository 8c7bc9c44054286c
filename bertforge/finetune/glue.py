"""The GLUE benchmark on local files: find each task's directory, fine-tune the model on its train split with
`finetune`, score its dev split(s) with the task's official metric, and report the GLUE table.

    from bertforge.finetune.glue import glue
    report = glue("path/to/bert", "glue_data", out="runs/glue", max_train_examples=2000, epochs=1)
    report["average"], report["tasks"]["CoLA"]["scores"]      # {"mcc": 41.3}, in percent

The directory has the layout of GLUE's own download (`download_glue_data.py`): one directory per task (`CoLA/`,
`SST-2/`, ...; lower-case names such as `cola/`, `sst-2/` or `sst2/` are found too) holding `train.tsv` and
`dev.tsv` (MNLI: `dev_matched.tsv` and `dev_mismatched.tsv`), each file in that task's own columns (`GLUE_TASKS`).
WNLI and the diagnostic set are not run (the usual GLUE average, as in the BERT paper, leaves WNLI out).

Each task's files are read and checked (a malformed row is an error naming the file and line) before any training
starts; a sample of `max_train_examples` training examples (drawn with the run's seed) and the whole dev split are
handed to `finetune` as plain JSONL in a temporary directory (the same one for the same run directory, so that a
resumed task finds its files where its run recorded them). The table gives one number per task (in percent):
its metric, or the mean of its two (MRPC and QQP: F1 and accuracy; STS-B: Pearson and Spearman; MNLI: matched and
mismatched accuracy); the GLUE average is the mean of those numbers over the tasks that ran.

`resume=True` (`glue --resume --out RUN`) continues a run that stopped: the tasks it finished (each wrote
TASK/glue_task.json, its entry of glue.json) are read back, the task it was in resumes from that fine-tuning's newest
checkpoint (`finetune --resume`), and the rest run as usual; the run's settings must be the ones it recorded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..core.io import atomic_write_text, json_line
from ..core.state import DataChanged
from ..core.options import option
from ..core.system import Runtime, from_main, on_every_rank, on_main, setup_runtime, teardown_runtime
from ..training.loop import RunLifecycle
from ..training.run_dir import RunDirectory, RunKind
from .api import FINETUNING, RUN_MARKER, evaluate, finetune, make_settings
from .config import FinetuneConfig, check_int
from .data import TextExample, read_classification
from ..core.hub import looks_like_hub_id, model_reference

log = logging.getLogger("bertforge")

MARKER = "glue_config.json"  # written when a GLUE run starts: marks its --out as one (`--overwrite` may replace it)
METRIC_NAMES = {"mcc": "MCC", "accuracy": "acc", "f1": "F1", "pearson": "Pearson", "spearman": "Spearman"}


@dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its text, second text and label are in its files, and how it is scored."""

    name: str
    text: str  # a header name, or a 0-based column index for a file without a header (CoLA)
    label: str
    pair: str | None = None
    header: bool = True
    metrics: tuple[str, ...] = ("accuracy",)  # names of `finetune`'s metrics; the first picks the best checkpoint
    dev_splits: tuple[tuple[str, str], ...] = (("dev", ""),)  # (file stem, the name its scores carry)
    regression: bool = False

    def files(self) -> list[str]:
        return ["train.tsv"] + [f"{stem}.tsv" for stem, _ in self.dev_splits]

    def score_names(self) -> list[str]:
        """The task's numbers in the table: its metrics, split by dev split ("accuracy_m", "accuracy_mm")."""
        return [f"{metric}_{split}" if split else metric for _, split in self.dev_splits for metric in self.metrics]

    def heading(self) -> str:
        """The table's column heading: "MRPC F1/acc", "MNLI m/mm acc"."""
        splits = "/".join(split for _, split in self.dev_splits if split)
        metrics = "/".join(METRIC_NAMES[m] for m in self.metrics)
        return " ".join(part for part in (self.name, splits, metrics) if part)

    def directory(self, root: Path) -> Path | None:
        """The task's directory under `root`: its GLUE name, in lower case, or in lower case without the hyphen."""
        for name in dict.fromkeys((self.name, self.name.lower(), self.name.lower().replace("-", ""))):
            if (root / name).is_dir():
                return root / name
        return None


# In the order of the GLUE paper's tables.
GLUE_TASKS = (
    GlueTask("CoLA", text="3", label="1", header=False, metrics=("mcc",)),  # source, label, original label, text
    GlueTask("SST-2", text="sentence", label="label"),
    GlueTask("MRPC", text="#1 String", pair="#2 String", label="Quality", metrics=("f1", "accuracy")),
    GlueTask("STS-B", text="sentence1", pair="sentence2", label="score", metrics=("pearson", "spearman"),
             regression=True),
    GlueTask("QQP", text="question1", pair="question2", label="is_duplicate", metrics=("f1", "accuracy")),
    GlueTask("MNLI", text="sentence1", pair="sentence2", label="gold_label",
             dev_splits=(("dev_matched", "m"), ("dev_mismatched", "mm"))),
    GlueTask("QNLI", text="question", pair="sentence", label="label"),
    GlueTask("RTE", text="sentence1", pair="sentence2", label="label"),
)

# A GLUE run's directory: its table, its report, its settings and one fine-tuning run per task (`--overwrite`
# replaces them all, the previous run kept aside until the new run's first task is done; `--resume` continues it)
GLUE_RUN = RunKind(command="glue", what="GLUE run", config_file=MARKER,
                   entries=("glue.json", "glue.md", MARKER, *(task.name for task in GLUE_TASKS)),
                   resumable=frozenset({"out", "resume", "overwrite", "progress", "versions",
                                        *(f"finetune.{k}" for k in FINETUNING.resumable)}))
TASK_RESULT = "glue_task.json"  # TASK/glue_task.json: a finished task's entry of glue.json (what --resume reads back)
# FinetuneConfig fields about one invocation: recorded beside the run's settings, not among the "finetune" ones
GLUE_INVOCATION = ("resume", "overwrite", "progress")

# FinetuneConfig fields that glue sets for each task itself
SET_BY_GLUE = ("task", "model", "train", "dev", "out", "metric", "text_column", "text_pair_column", "label_column",
               "no_header")


@dataclass(kw_only=True, frozen=True)
class GlueOptions:
    """The settings of a GLUE run beside the fine-tuning ones (each field is also a `bertforge glue` option)."""

    data_dir: str = option(help="directory of GLUE tasks: CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/, RTE/ "
                           "(or lower case), each with train.tsv and dev.tsv", metavar="DIR")
    out: str | None = option(None, "output directory: glue.json, glue.md and one fine-tuning run per task "
                             "(default: glue-NAME, NAME the model directory's)", metavar="DIR")
    tasks: list[str] | None = option(None, "the tasks to run, e.g. CoLA SST-2 (default: every task found; a task "
                                     "named here must be there)", metavar="TASK")
    max_train_examples: int | None = option(None, "fine-tune each task on a random sample of at most N training "
                                            "examples, drawn with --seed (default: all)", metavar="N")

    def validate(self) -> None:
        if not isinstance(self.data_dir, str) or not self.data_dir:
            raise BertforgeError("glue needs data_dir (a directory)")
        if self.max_train_examples is not None:
            check_int("max_train_examples", self.max_train_examples, 2)
        if self.tasks is not None:
            if isinstance(self.tasks, str) or not self.tasks:
                raise BertforgeError(f"tasks must be a non-empty list of task names, got {self.tasks!r}")
            for name in self.tasks:
                task_named(name)


def task_named(name: str) -> GlueTask:
    """The task called `name`, in any case, with or without its hyphen ("sst2", "STS-B")."""
    key = str(name).lower().replace("-", "")
    for task in GLUE_TASKS:
        if task.name.lower().replace("-", "") == key:
            return task
    raise BertforgeError(f"unknown GLUE task {name!r}; choose from: {', '.join(t.name for t in GLUE_TASKS)}")


def find_tasks(
    data_dir: str | Path, names: list[str] | None = None
) -> tuple[list[tuple[GlueTask, Path]], dict[str, str]]:
    """The tasks (among `names`, or all) whose files are under `data_dir`, with their directories, and the reason
    each other task is skipped. A task named in `names` that is not there is an error, as is finding none."""
    root = Path(data_dir)
    if not root.is_dir():
        raise BertforgeError(f"{root}: no such directory (--data-dir: the directory of GLUE tasks)")
    wanted = {task_named(name).name for name in names} if names else {task.name for task in GLUE_TASKS}
    found, skipped = [], {}
    for task in GLUE_TASKS:
        if task.name not in wanted:
            continue
        directory = task.directory(root)
        missing = [] if directory is None else [f for f in task.files() if not (directory / f).is_file()]
        if directory is not None and not missing:
            found.append((task, directory))
            continue
        reason = f"no {task.name}/ directory" if directory is None else f"{directory.name}/ has no {', '.join(missing)}"
        if names:
            raise BertforgeError(f"{root}: {reason} (the task {task.name} was asked for)")
        skipped[task.name] = reason
    if not found:
        expected = ", ".join(f"{t.name}/" for t in GLUE_TASKS)
        raise BertforgeError(f"{root}: no GLUE task found (expected directories {expected} with train.tsv and dev.tsv)")
    return found, skipped


# ---------------------------------------------------------------------------------------------------- reading


def read_split(task: GlueTask, path: str | Path, lenient: bool = False) -> list[TextExample]:
    """A GLUE file's examples in the task's columns; labels as written (STS-B's scores checked to be numbers)."""
    examples = read_classification(path, task.text, task.pair, task.label, no_header=not task.header,
                                   require_labels=True, lenient=lenient)
    if task.regression:
        for example in examples:
            try:
                valid = math.isfinite(float(example.label))
            except ValueError:
                valid = False
            if not valid:
                raise BertforgeError(f"{path}:{example.line}: the {task.name} score {example.label!r} is not a number")
    return examples


def _label_key(label: str) -> str:
    """"1" and "01" are one label, as `finetune` reads them."""
    text = label.strip()
    return str(int(text)) if text.lstrip("-").isdigit() else text


@dataclass
class DevSplit:
    stem: str  # the file's name without .tsv: "dev", or MNLI's "dev_matched" / "dev_mismatched"
    source: Path
    data: Path  # the examples as JSONL, in the run's temporary directory
    examples: int


@dataclass
class PreparedTask:
    """A task whose files were read and checked, its data written for `finetune`."""

    task: GlueTask
    directory: Path
    train: Path
    train_examples: int
    train_available: int
    devs: list[DevSplit]


def prepare_task(task: GlueTask, directory: Path, work: Path, max_train_examples: int | None, seed: int,
                 lenient: bool = False) -> PreparedTask:
    """Read and check a task's files, sample its training examples, and write the JSONL files `finetune` reads."""
    train_path = directory / "train.tsv"
    train = read_split(task, train_path, lenient)
    available = len(train)
    if max_train_examples is not None and available > max_train_examples:
        keep = sorted(random.Random(seed).sample(range(available), max_train_examples))
        train = [train[i] for i in keep]
    known = {_label_key(e.label) for e in train}
    if not task.regression and len(known) < 2:
        raise BertforgeError(f"{train_path}: the training examples have one label only ({', '.join(known)}); "
                             f"{task.name} needs at least two (raise --max-train-examples?)")
    target = work / task.name
    target.mkdir(parents=True)
    _write_jsonl(task, train, target / "train.jsonl")
    devs = []
    for stem, _ in task.dev_splits:
        path = directory / f"{stem}.tsv"
        examples = read_split(task, path, lenient)
        for example in examples if not task.regression else []:
            if _label_key(example.label) not in known:
                raise BertforgeError(f"{path}:{example.line}: label {example.label!r} is not among the training "
                                     f"labels ({', '.join(sorted(known))})")
        _write_jsonl(task, examples, target / f"{stem}.jsonl")
        devs.append(DevSplit(stem, path, target / f"{stem}.jsonl", len(examples)))
    return PreparedTask(task, directory, target / "train.jsonl", len(train), available, devs)


def _write_jsonl(task: GlueTask, examples: list[TextExample], path: Path) -> None:
    """{"text", "text_pair", "label"} a line; a regression score as a JSON float (so `finetune` regresses)."""
    with open(path, "w", encoding="utf-8") as out:
        for e in examples:
            record = {"text": e.text, "text_pair": e.text_pair, "label": float(e.label) if task.regression else e.label}
            out.write(json_line(record))


# ---------------------------------------------------------------------------------------------------- scores


def task_scores(task: GlueTask, metrics: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The task's numbers in percent, from `finetune`'s metrics of each dev split (by its file stem: "dev")."""
    return {
        f"{metric}_{split}" if split else metric: 100.0 * float(metrics[stem][metric])
        for stem, split in task.dev_splits
        for metric in task.metrics
    }


def task_score(scores: dict[str, float]) -> float:
    """One number per task: its metric, or the mean of its metrics."""
    return sum(scores.values()) / len(scores)


def glue_average(scores_by_task: dict[str, dict[str, float]]) -> float:
    """The GLUE average: the mean over tasks of each task's one number."""
    if not scores_by_task:
        raise BertforgeError("no task was scored")
    return sum(task_score(s) for s in scores_by_task.values()) / len(scores_by_task)


def glue_table(label: str, scores_by_task: dict[str, dict[str, float]]) -> str:
    """The GLUE table in Markdown: a column per task (in GLUE's order; "F1/acc" cells for two numbers), then the
    average."""
    tasks = [t for t in GLUE_TASKS if t.name in scores_by_task]
    headings = ["model"] + [t.heading() for t in tasks] + ["average"]
    cells = [label] + ["/".join(f"{scores_by_task[t.name][n]:.1f}" for n in t.score_names()) for t in tasks]
    cells.append(f"{glue_average(scores_by_task):.1f}")
    lines = ["| " + " | ".join(headings) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(headings) - 1)) + "|",
             "| " + " | ".join(cells) + " |"]
    return "\n".join(lines) + "\n"


def model_label(model: str | Path) -> str:
    """How the table names a model: its directory's name (and its parent's for a fine-tuning run's `model/`)."""
    if looks_like_hub_id(str(model)) and not Path(model).exists():  # a Hub id names itself
        return str(model).replace("/", "-")
    path = Path(model).resolve()
    return f"{path.parent.name}/{path.name}" if path.name == "model" and path.parent.name else path.name


# ---------------------------------------------------------------------------------------------------- the run


def glue(
    model: str | Path,
    data_dir: str | Path,
    out: str | Path | None = None,
    *,
    tasks: list[str] | None = None,
    max_train_examples: int | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """Fine-tune `model` on every GLUE task found in `data_dir` (or those of `tasks`) and score each on its dev
    split(s); write `out`/glue.json (the report returned here), `out`/glue.md (the table) and, for each task,
    `out`/TASK/ (`finetune`'s run directory: the fine-tuned model, eval.json, metrics.jsonl, ...).

    `settings` are `FinetuneConfig` fields (epochs, lr, batch_size, seed, max_length, device, overwrite, ...),
    the same for every task; their defaults are `finetune`'s. Every file is read and checked before training.
    """
    options = GlueOptions(data_dir=str(data_dir), out=None if out is None else str(out), tasks=tasks,
                          max_train_examples=max_train_examples)
    options.validate()
    template = finetune_template(model, settings)
    # a bad --device fails before anything is read; under torchrun, every task's fine-tuning shares the process group
    rt = setup_runtime(template.device)
    found, skipped = on_every_rank(rt, lambda: _check_model(template.model) or find_tasks(options.data_dir,  # type: ignore[func-returns-value]
                                                                                        options.tasks))
    for name, reason in skipped.items() if rt.is_main else ():
        log.warning("GLUE: skipping %s (%s)", name, reason)
    target = Path(options.out or f"glue-{model_label(model)}").resolve()
    saved = {**dataclasses.asdict(options), "model": template.model, "finetune": _settings_of(template),
             **{k: getattr(template, k) for k in GLUE_INVOCATION}}
    lifecycle = RunLifecycle(RunDirectory(target, template.resume, template.overwrite, saved, GLUE_RUN), rt)
    with lifecycle.guarded():  # rank 0 locks, checks and prepares `target`; a failure puts a replaced run back
        lifecycle.lock(lifecycle.run_dir.refuse_foreign)
        with _work_directory(target, rt.rank) as work:
            prepared = on_every_rank(rt, lambda: [
                prepare_task(task, directory, work, options.max_train_examples, template.seed,
                             template.lenient_rows) for task, directory in found])
            lifecycle.prepare()  # the first change to `target`: glue_config.json
            results = _run_tasks(prepared, template, target, rt, lifecycle)
        report = glue_report(model, options, results, skipped)
        report["settings"] = saved
        on_main(rt, lambda: _write_report(target, report))
    teardown_runtime(rt)  # the process group, where glue set it up (on success only, as `finetune`)
    return report


@contextlib.contextmanager
def _work_directory(target: Path, rank: int) -> Iterator[Path]:
    """A private temporary directory for the tasks' prepared files, at the same path for the same run directory and
    rank (a resumed task's fine-tuning finds --train and --dev where it recorded them); removed at the end."""
    user = os.getuid() if hasattr(os, "getuid") else ""
    digest = hashlib.blake2b(f"{user}:{target}".encode(), digest_size=8).hexdigest()
    work = Path(tempfile.gettempdir()) / f"bertforge-glue-{digest}-{rank}"
    if work.is_dir() and not work.is_symlink():
        shutil.rmtree(work)  # what a run killed in this run directory left
    work.mkdir(mode=0o700)
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _write_report(target: Path, report: dict[str, Any]) -> None:
    atomic_write_text(target / "glue.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(target / "glue.md", glue_markdown(report))
    log.info("GLUE table written to %s", target / "glue.md")


def finetune_template(model: str | Path, settings: dict[str, Any]) -> FinetuneConfig:
    """The fine-tuning settings every task shares, checked (train, dev and out are set per task)."""
    clash = sorted(set(settings) & set(SET_BY_GLUE))
    if clash:
        raise BertforgeError(f"glue sets {', '.join(clash)} for each task itself; leave them out")
    placeholders = {"task": "classification", "train": "-", "dev": "-", "out": "-"}
    template = make_settings(FinetuneConfig, {**placeholders, "model": model_reference(model), **settings})
    template.validate()
    return template


def _check_model(model: str) -> None:
    """The model's config and tokenizer load (a bad model directory fails before any data is read); None."""
    from ..model.config import BertConfig
    from ..tokenizer import Tokenizer

    BertConfig.from_pretrained(model)
    Tokenizer.from_pretrained(model)


def _settings_of(template: FinetuneConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(template).items() if k not in SET_BY_GLUE + GLUE_INVOCATION}


def _run_tasks(prepared: list[PreparedTask], template: FinetuneConfig, target: Path, rt: Runtime,
               lifecycle: RunLifecycle) -> dict[str, dict[str, Any]]:
    """Fine-tune and score each prepared task in turn, under a progress bar of the tasks (rank 0's). Once the first
    task is done, the run `--overwrite` replaced goes."""
    from tqdm.auto import tqdm

    results = {}
    disable = None if template.progress is None else not template.progress  # None: a bar on a terminal only
    with tqdm(prepared, desc="GLUE", unit="task", disable=disable if rt.is_main else True) as bar:
        for task in bar:
            name = task.task.name
            bar.set_postfix_str(name)
            settings = template
            if template.resume:  # a finished task's entry is read back; the one the run stopped in resumes
                done, started = from_main(rt, lambda: (_finished_task(target / name),  # noqa: B023 (called at once)
                                                       (target / name / RUN_MARKER).is_file()))  # noqa: B023
                if done is not None:
                    results[name] = done
                    continue
                settings = dataclasses.replace(template, resume=started)
            results[name] = run_task(task, settings, target, rt)
            lifecycle.checkpointed()
    return results


def _finished_task(run_dir: Path) -> dict[str, Any] | None:
    """The glue.json entry a finished task wrote in its run directory (TASK_RESULT), or None."""
    path = run_dir / TASK_RESULT
    if not path.is_file():
        return None
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertforgeError(f"--resume: {path}: unreadable ({err}); remove it to run the task again") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("scores"), dict):
        raise BertforgeError(f"--resume: {path} is not a task's GLUE entry; remove it to run the task again")
    return entry


def run_task(prepared: PreparedTask, template: FinetuneConfig, target: Path, rt: Runtime | None = None) -> dict[str, Any]:
    """Fine-tune on the task's training sample, scored on its first dev split (which picks the best checkpoint);
    score that checkpoint on any further split (MNLI mismatched). Returns the task's entry of glue.json."""
    task = prepared.task
    run_dir = target / task.name
    columns: dict[str, Any] = {"text_column": "text", "text_pair_column": "text_pair" if task.pair else None, "label_column": "label",
               "no_header": False}
    first, *more = prepared.devs
    cfg = dataclasses.replace(template, train=str(prepared.train), dev=str(first.data), out=str(run_dir),
                              metric=task.metrics[0], **columns)
    try:
        summary = finetune(cfg)
    except DataChanged as err:  # it names the prepared files; the user's are the task's own
        sources = [prepared.directory / "train.tsv", first.source]
        changed = sources[err.file] if err.file is not None and err.file < len(sources) else prepared.directory
        raise DataChanged(f"cannot resume GLUE task {task.name}: its data differs from the checkpoint's ({changed} "
                          f"changed since the run started, or its examples were sampled otherwise); resume with the "
                          f"data the run started with, or start a new run") from None
    metrics = {first.stem: summary["metrics"]}
    for split in more:  # rank 0 scores the saved model, every rank learns the metrics
        def score(data: Path = split.data) -> dict[str, Any]:
            return evaluate("classification", run_dir / "model", data, **dataclasses.asdict(cfg.data_options()))

        metrics[split.stem] = score() if rt is None else from_main(rt, score)
    scores = task_scores(task, metrics)
    entry = {
        "scores": scores,
        "score": task_score(scores),
        "metrics": metrics,
        "dev": {split.stem: {"file": str(split.source), "examples": split.examples} for split in prepared.devs},
        "train": {"file": str(prepared.directory / "train.tsv"), "examples": prepared.train_examples,
                  "available": prepared.train_available},
        "run": str(run_dir),
        "train_steps": summary["train_steps"],
        "train_seconds": summary["train_seconds"],
    }

    def record() -> None:  # what --resume reads back instead of running the task again
        atomic_write_text(run_dir / TASK_RESULT, json.dumps(entry, indent=2) + "\n")

    if rt is None:
        record()
    else:
        on_main(rt, record)
    return entry


def glue_report(model: str | Path, options: GlueOptions, results: dict[str, dict[str, Any]],
                skipped: dict[str, str]) -> dict[str, Any]:
    """glue.json: the average, each task's scores and details, and the tasks skipped and why."""
    scores = {name: result["scores"] for name, result in results.items()}
    return {
        "model": model_reference(model),
        "model_label": model_label(model),
        "data_dir": str(Path(options.data_dir).resolve()),
        "average": glue_average(scores),
        "tasks_run": len(results),
        "tasks": results,
        "skipped": skipped,
        "table": glue_table(model_label(model), scores),
    }


def glue_markdown(report: dict[str, Any]) -> str:
    """glue.md: the table, what the average covers, and the skipped tasks."""
    lines = [f"# GLUE dev results: {report['model_label']}", "", report["table"].rstrip("\n"), ""]
    ran = report["tasks_run"]
    lines.append(f"Scores in percent on each task's dev split; the average is over the {ran} task"
                 f"{'s' if ran != 1 else ''} run here (of {len(GLUE_TASKS)}), two-metric tasks averaged first.")
    settings = report.get("settings", {})
    if settings:
        limit = settings.get("max_train_examples")
        tuning = settings.get("finetune", {})
        lines.append(f"Fine-tuned {tuning.get('epochs')} epoch(s) at lr {tuning.get('lr')}, batch size "
                     f"{tuning.get('batch_size')}, seed {tuning.get('seed')}, on "
                     f"{'at most ' + str(limit) if limit else 'all'} training examples per task.")
    for name, reason in report["skipped"].items():
        lines.append(f"- {name} skipped: {reason}")
    return "\n".join(lines) + "\n"
