"""Multiple choice: `finetune --task multiple-choice` trains a `BertForMultipleChoice` (each example's choices
scored by one logit each, the cross-entropy of the right one's index), SWAG-style, as `transformers`'
`AutoModelForMultipleChoice` and its `run_swag` example do.

Rows (CSV/TSV/JSONL/Parquet/Arrow, or rows in memory), one example each:

* SWAG's layout: `sent1` (the context), `sent2` (the start of every choice), `ending0` ... `endingN` and `label`
  (the right ending's index, from 0). Choice k is the pair (sent1, sent2 + " " + ending k), as in `run_swag`.
* Any other: the context's column by `--text-column` (default: `sent1`, else `context`, else `question`), the
  choices' columns by `--choice-columns A B C ...` in order (or one column holding a list of choices: JSONL,
  Parquet, rows in memory; default: the `endingK` columns, else a `choices` column), a text put before every
  choice by `--text-pair-column` (default: `sent2` where there is one) and the right choice's index by
  `--label-column` (default `label`).

Every example of a file needs the same number of choices (at least two). A missing column, an empty choice, a
label that is not an index of a choice, or a row with a different number of choices is refused naming the file,
the row and the column. The metric is `accuracy` (the likeliest choice is the right one). Families whose
`transformers` library has no ForMultipleChoice class (`Family.multiple_choice`) are refused: the model would
save under a class name nothing else loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import BertforgeError
from ..data.tables import InMemory, Record
from ..model import BertForMultipleChoice
from ..model.config import BertConfig
from . import metrics as M
from .config import DataOptions
from .data import read_text_file, record_source, table_rows
from .features import Feature
from .tasks import TASK_CLASSES, Encoded, Output, Task, _softmax

CONTEXT_COLUMNS = ("sent1", "context", "question")  # the context's column when --text-column is not given
PREFIX_COLUMN = "sent2"  # SWAG's start of every choice, put before each ending
ENDING = re.compile(r"ending(\d+)")  # SWAG's choice columns: ending0, ending1, ...
CHOICES_COLUMN = "choices"  # one column holding the list of choices


@dataclass
class ChoiceExample:
    """One example: its context, its choices (each the second text of its pair, any prefix put before it) and the
    right choice's index (None when predicting from unlabelled rows)."""

    line: int
    context: str
    choices: list[str]
    label: int | None


@dataclass(frozen=True)
class Columns:
    """Where a file's context, prefix, choices and label are."""

    context: str
    prefix: str | None
    choices: tuple[str, ...]
    label: str


# ---------------------------------------------------------------------------------------------------- reading


def _columns(path: Path, names: list[str], opts: DataOptions) -> Columns:
    """The columns of a file whose (first) row has the columns `names`, from the options or SWAG's defaults."""
    known = ", ".join(names)
    context = opts.text_column or next((c for c in CONTEXT_COLUMNS if c in names), None)
    if context is None:
        raise BertforgeError(f"{path}: name the context's column with --text-column (no {', '.join(CONTEXT_COLUMNS)} "
                             f"column; columns: {known})")
    if opts.choice_columns:
        choices = tuple(opts.choice_columns)
    else:
        endings = sorted((c for c in names if ENDING.fullmatch(c)), key=lambda c: int(c[len("ending"):]))
        choices = tuple(endings) or ((CHOICES_COLUMN,) if CHOICES_COLUMN in names else ())
        if not choices:
            raise BertforgeError(f"{path}: name the choices' columns with --choice-columns (no ending0, ending1, ... "
                                 f"or {CHOICES_COLUMN} column; columns: {known})")
    prefix = opts.text_pair_column or (PREFIX_COLUMN if PREFIX_COLUMN in names and context != PREFIX_COLUMN
                                       and PREFIX_COLUMN not in choices else None)
    return Columns(context, prefix, choices, opts.label_column)


def _text(value: Any, where: str, column: str) -> str:
    if not isinstance(value, str) or not value.strip():
        what = "is empty" if value is None or value == "" else f"is not a text ({value!r:.60})"
        raise BertforgeError(f"{where}: column {column!r} {what}")
    return value


def _label(value: Any, where: str, column: str, count: int) -> int:
    """The right choice's index: an integer (or its digits) from 0 to `count` - 1."""
    index: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        index = value
    elif isinstance(value, float) and value.is_integer():
        index = int(value)  # pandas writes an integer column beside a blank as floats
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        index = int(value.strip())
    if index is None:
        raise BertforgeError(f"{where}: label {value!r:.60} (column {column!r}) is not the index of a choice "
                             f"(0 to {count - 1})")
    if not 0 <= index < count:
        raise BertforgeError(f"{where}: label {index} (column {column!r}) is out of range for {count} choices "
                             f"(0 to {count - 1})")
    return index


def _example(path: Path, line: int, record: dict[str, Any], columns: Columns, labelled: bool) -> ChoiceExample:
    where = f"{path}:{line}"
    for column in (columns.context, columns.prefix, *columns.choices):
        if column is not None and column not in record:
            raise BertforgeError(f"{where}: no column {column!r} (columns: {', '.join(map(str, record))})")
    context = _text(record[columns.context], where, columns.context)
    prefix = _text(record[columns.prefix], where, columns.prefix) if columns.prefix is not None else None
    if len(columns.choices) == 1 and isinstance(record[columns.choices[0]], (list, tuple)):
        column = columns.choices[0]  # one column, a list of choices
        endings = [_text(v, f"{where}: choice {k}", column) for k, v in enumerate(record[column])]
    else:
        endings = [_text(record[c], where, c) for c in columns.choices]
    if len(endings) < 2:
        raise BertforgeError(f"{where}: {len(endings)} choice(s); a multiple-choice example needs at least two "
                             f"(columns: {', '.join(columns.choices)})")
    choices = [f"{prefix} {e}" if prefix is not None else e for e in endings]
    value = record.get(columns.label)
    if value is None or value == "":
        if labelled:
            raise BertforgeError(f"{where}: no label (column {columns.label!r})")
        return ChoiceExample(line, context, choices, None)
    return ChoiceExample(line, context, choices, _label(value, where, columns.label, len(choices)))


def read_choices(data: str | Path | InMemory, opts: DataOptions, labelled: bool) -> list[ChoiceExample]:
    """The examples of a CSV/TSV/JSONL/Parquet/Arrow file or of rows in memory (see the module docstring)."""
    source = record_source(data)
    records: list[Record]
    if source is not None:
        path, records = source
    else:
        path = Path(data)  # type: ignore[arg-type]
        header, cells = table_rows(path, read_text_file(path), opts.no_header, opts.lenient_rows)
        names = header if header is not None else [str(i) for i in range(len(cells[0][1]) if cells else 0)]
        records = [(line, dict(zip(names, row))) for line, row in cells]
    if not records:
        raise BertforgeError(f"{path}: no examples (only a header?)")
    columns = _columns(path, [str(c) for c in records[0][1]], opts)
    examples = [_example(path, line, record, columns, labelled) for line, record in records]
    first = examples[0]
    for example in examples[1:]:
        if len(example.choices) != len(first.choices):
            raise BertforgeError(f"{path}:{example.line}: {len(example.choices)} choices, but line {first.line} has "
                                 f"{len(first.choices)} (every example of a file needs the same number of choices)")
    return examples


# ---------------------------------------------------------------------------------------------------- the task


def require_multiple_choice(config: BertConfig, source: Path | str) -> None:
    """Refuse a family whose `transformers` library has no ForMultipleChoice class (`Family.multiple_choice`)."""
    family = config.family
    if not family.multiple_choice:
        raise BertforgeError(f"{source}: multiple choice is not available for {family.name} models: transformers has "
                             f"no {family.architecture(BertForMultipleChoice.__name__)}, so the fine-tuned model "
                             "could not be loaded outside bertforge")


def encode_choices(tokenizer: Any, examples: list[ChoiceExample], max_length: int, labelled: bool) -> list[Feature]:
    """For each example, its choices' pairs [CLS] context [SEP] choice [SEP] (truncated to `max_length`, the longer
    text first): the lists of token ids of each choice, and the right choice's index."""
    encoded = tokenizer([e.context for e in examples for _ in e.choices], [c for e in examples for c in e.choices],
                        truncation=True, max_length=max_length)
    features, start = [], 0
    for example in examples:
        end = start + len(example.choices)
        feature: Feature = {"input_ids": encoded["input_ids"][start:end],
                            "token_type_ids": encoded["token_type_ids"][start:end]}
        if labelled:
            feature["labels"] = example.label
        features.append(feature)
        start = end
    return features


class MultipleChoice(Task):
    """Multiple choice (see the module docstring)."""

    name = "multiple-choice"
    model_class = BertForMultipleChoice
    metric_names = ("accuracy",)

    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[ChoiceExample], bool]:
        return read_choices(path, opts, labelled), False

    def label_overrides(self, examples: list[ChoiceExample], path: Path) -> dict[str, Any]:
        return {}  # one logit per choice, whatever the number of choices: no label space

    def encode(self, tokenizer: Any, examples: list[ChoiceExample], opts: DataOptions, config: BertConfig,
               path: Path, labelled: bool) -> Encoded:
        require_multiple_choice(config, path)
        return Encoded(path, examples, encode_choices(tokenizer, examples, self.max_length(opts, config), labelled))

    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        gold = [f["labels"] for f in data.features]
        return {"accuracy": M.accuracy(gold, [int(o["logits"].argmax()) for o in outputs])}

    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        """One record per example: the likeliest choice's index ("label") and text, its probability and every
        choice's (the softmax over the example's logits)."""
        records = []
        for example, output in zip(data.examples, outputs):
            probs = _softmax(output["logits"].astype(np.float64))
            best = int(probs.argmax())
            records.append({"line": example.line, "context": example.context, "choices": example.choices,
                            "label": best, "text": example.choices[best], "score": float(probs[best]),
                            "probabilities": [float(p) for p in probs]})
        return records

    def sequences_per_example(self, examples: list[ChoiceExample], cfg: Any) -> int:
        """Each example is its choices' sequences."""
        return max(len(e.choices) for e in examples)


TASK_CLASSES[MultipleChoice.name] = MultipleChoice
