"""Reading the training and dev files of `train-embeddings`: pairs, triplets or scored pairs.

Formats (by file name, as for fine-tuning): TSV (`.tsv`, `.tab`), JSONL (`.jsonl`, `.json`, `.ndjson`), else CSV.
Columns are read in order, as sentence-transformers reads a dataset's columns: the first text is the anchor, the
second its positive (or, in a scored pair, the other sentence), any further texts are hard negatives; a column named
`score`, `label` or `similarity` holds the score of a scored pair.

* CSV/TSV: the first row is a header when every cell of it is a column name of this kind (`anchor`, `positive`,
  `negative`, `query`, `passage`, `sentence1`, `sentence2`, `score`, ..., optionally numbered: `negative_2`), when
  the last column is a number on every other row but not on the first, or when its cells are other names (distinct
  one-word identifiers such as `english`, `src_text`) above rows most of which hold texts of several words;
  otherwise every row is data. With three
  columns or more, a last column that is a number on every data row is the score.
* JSONL: one JSON object a line; its keys in order are the columns (the same keys on every line). Parquet and
  Arrow files (`.parquet`, `.arrow`, `.feather`: their columns in order) and rows in memory (the Python API: a list
  of dicts, a dict of lists, a `datasets.Dataset`) are read the same way (`bertforge.data.tables`).

The shape follows: 2 texts and a score → scored pairs, 2 texts → pairs, 3 or more texts → triplets (anchor,
positive, negatives), 3 texts and a score → scored triplets (query, positive, negative and a teacher's margin,
score(query, positive) - score(query, negative): margin-MSE distillation). Anything else, an empty text, a score that is not a number or rows of different widths are
refused naming the file and the line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..data.tables import Record
from ..finetune.data import read_text_file, record_source, table_rows

log = logging.getLogger("bertforge")

SCORE_COLUMNS = ("score", "label", "similarity")
_COLUMN_NAME = re.compile(
    r"(anchor|positive|negative|query|question|answer|passage|document|doc|pos|neg|text|sentence|premise|"
    r"hypothesis|title|context|score|label|similarity)[_ ]?(\d+|[ab])?", re.IGNORECASE)
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.-]{0,63}")
PROMPT_ROLES = ("query", "document")  # the prompt names of the first column and of the others
SHAPES = ("pairs", "triplets", "scored", "scored-triplets")


@dataclass
class PairData:
    """A file's examples, column by column: `texts[0]` the anchors, `texts[1]` the positives (or second sentences),
    `texts[2:]` hard negatives; `scores` for scored pairs and triplets (None otherwise); `lines` each example's
    line; `names` the text columns' names (a header's, a JSON object's keys; None for a file without them)."""

    path: Path
    shape: str  # "pairs", "triplets", "scored" or "scored-triplets"
    texts: list[list[str]]
    scores: list[float] | None
    lines: list[int]
    names: list[str] | None = None

    def __len__(self) -> int:
        return len(self.lines)


def read_pairs(data: Any) -> PairData:
    """Read a pair, triplet or scored-pair file, or such rows in memory (see the module docstring)."""
    source = record_source(data)
    names: list[str] | None
    if source is not None:
        path, records = source
        names, rows = _record_rows(path, records)
    else:
        path = Path(data)
        names, rows = _table_rows(path, read_text_file(path))
    return _examples(path, names, rows)


def _table_rows(path: Path, text: str) -> tuple[list[str] | None, list[tuple[int, list[Any]]]]:
    try:
        _, rows = table_rows(path, text, no_header=True)
    except BertforgeError as err:  # its hint names fine-tuning's --lenient-rows, which this command does not have
        raise BertforgeError(str(err).replace(" (--lenient-rows skips malformed rows)", "")) from None
    first = [c.strip() for c in rows[0][1]]
    numeric_last = len(first) > 2 and len(rows) > 1 and all(_number(cells[-1]) is not None for _, cells in rows[1:])
    if (all(_COLUMN_NAME.fullmatch(c) for c in first) or (numeric_last and _number(first[-1]) is None)
            or _other_names(first, rows[1:])):
        if len(rows) == 1:
            raise BertforgeError(f"{path}: no examples (only a header?)")
        names = [c.lower() for c in first]
        if numeric_last and not any(n in SCORE_COLUMNS for n in names):
            names[-1] = "score"
        return names, rows[1:]
    if numeric_last:
        return [f"text{i}" for i in range(len(first) - 1)] + ["score"], rows
    return None, rows


def _other_names(first: list[str], data: list[tuple[int, list[Any]]]) -> bool:
    """A first row of column names of another kind (`english`, `src_text`): distinct identifiers, each one word,
    above rows most of which hold texts of several words."""
    if not data or len(set(first)) != len(first) or not all(_IDENTIFIER.fullmatch(c) for c in first):
        return False
    texts = sum(any(any(ch.isspace() for ch in str(c).strip()) for c in cells) for _, cells in data)
    if texts * 2 <= len(data):
        return False
    log.info("first row read as a header (columns %s; read in order: anchor, positive, ...)", ", ".join(first))
    return True


def _record_rows(path: Path, records: list[Record]) -> tuple[list[str], list[tuple[int, list[Any]]]]:
    names = list(records[0][1])
    rows = []
    for line, record in records:
        if list(record) != names:
            raise BertforgeError(f"{path}:{line}: keys {list(record)}, but line {records[0][0]} has {names} "
                                 f"(every line needs the same keys, in the same order)")
        rows.append((line, list(record.values())))
    return [n.lower() for n in names], rows


def _examples(path: Path, names: list[str] | None, rows: list[tuple[int, list[Any]]]) -> PairData:
    width = len(rows[0][1])
    score_at = next((i for i, n in enumerate(names or []) if n in SCORE_COLUMNS), None)
    text_at = [i for i in range(width) if i != score_at]
    what = f"columns {', '.join(names)}" if names else f"{width} column{'s' if width != 1 else ''}"
    if len(text_at) < 2:
        raise BertforgeError(f"{path}: {what}: need at least two texts (anchor, positive), as pairs, triplets or "
                             f"scored pairs")
    if score_at is not None and len(text_at) not in (2, 3):
        raise BertforgeError(f"{path}: {what}: a scored file holds two texts and a score, or three (query, positive, "
                             f"negative) and their margin")
    shape = (("scored" if len(text_at) == 2 else "scored-triplets") if score_at is not None
             else "pairs" if len(text_at) == 2 else "triplets")
    texts: list[list[str]] = [[] for _ in text_at]
    scores: list[float] | None = [] if score_at is not None else None
    lines = []
    for line, cells in rows:
        for column, i in enumerate(text_at):
            value = cells[i]
            if not isinstance(value, str) or not value.strip():
                name = names[i] if names else f"column {i + 1}"
                problem = "is empty" if isinstance(value, str) or value is None else f"is not a text ({value!r})"
                raise BertforgeError(f"{path}:{line}: {name} {problem}")
            texts[column].append(value)
        if scores is not None:
            score = _number(cells[score_at])  # type: ignore[index]
            if score is None:
                raise BertforgeError(f"{path}:{line}: the score {cells[score_at]!r} is not a number")  # type: ignore[index]
            scores.append(score)
        lines.append(line)
    return PairData(path, shape, texts, scores, lines, [names[i] for i in text_at] if names else None)


def with_prompts(data: PairData, prompts: list[str]) -> PairData:
    """`data` with `prompts[c]` put before every text of column c (`column_prompts`)."""
    texts = [[prompt + text for text in column] if prompt else column for prompt, column in zip(prompts, data.texts)]
    return dataclasses.replace(data, texts=texts)


def column_prompts(data: PairData, prompts: dict[str, str], strict: bool = True) -> list[str]:
    """The prompt of each text column of `data`: the one named after the column, else "query" for the first column
    (the anchors) and "document" for the others (positives, negatives), the roles sentence-transformers'
    `encode_query` and `encode_document` give those names; "" for none. `strict`: a prompt that names neither a
    column nor a role is refused."""
    names = data.names or []
    if strict:
        unknown = [name for name in prompts if name not in names and name not in PROMPT_ROLES]
        if unknown:
            columns = f"its columns are {', '.join(names)}" if names else "it has no column names"
            raise BertforgeError(f"--prompts {unknown[0]!r} names no column of {data.path} ({columns}) and is not "
                                 f"query (the first column) or document (the others)")
    return [prompts.get(names[c] if c < len(names) and names[c] in prompts else PROMPT_ROLES[c > 0], "")
            for c in range(len(data.texts))]


def _number(value: Any) -> float | None:
    """A finite number from a cell (a JSON number or a numeric string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def normalized_scores(data: PairData, score_max: float | None) -> list[float]:
    """The scores of a scored file on cosine's scale: score / `score_max` when given; otherwise scores already
    within [-1, 1] as they are and scores within [0, 5] (the STS benchmark's scale) divided by 5."""
    assert data.scores is not None
    low, high = min(data.scores), max(data.scores)
    if score_max is not None:
        if low < -score_max or high > score_max:
            raise BertforgeError(f"{data.path}: scores range from {low:g} to {high:g}, beyond --score-max {score_max:g}")
        return [s / score_max for s in data.scores]
    if -1 <= low and high <= 1:
        return list(data.scores)
    if 0 <= low and high <= 5:
        log.info("%s: scores within [0, 5] (STS scale) divided by 5; --score-max sets another scale", data.path)
        return [s / 5 for s in data.scores]
    raise BertforgeError(f"{data.path}: scores range from {low:g} to {high:g}, neither within [-1, 1] nor [0, 5]; "
                         f"give the top of their scale with --score-max")
