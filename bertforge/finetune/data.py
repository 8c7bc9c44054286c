"""Readers for the fine-tuning file formats. Every problem is a `BertforgeError` naming the file and line.

* Classification: CSV or TSV with a header row (or without one, columns then named by 0-based index), JSONL
  (one JSON object a line), Parquet or Arrow (`bertforge.data.tables`: read as JSONL objects are, row by row), or
  rows in memory. The format follows the file name: `.tsv`/`.tab` → TSV, `.jsonl`/`.json`/`.ndjson` → JSONL,
  `.parquet`/`.pq` → Parquet, `.arrow`/`.feather`/`.ipc`/`.arrows` → Arrow, anything else → CSV. A multi-label example's
  labels are a list (JSONL, a Parquet list column, rows in memory) or a text split on `--label-separator`.
  Every row must have as many fields as the header (or, without one, as the first row): a row with more or fewer
  (an unquoted comma in a CSV text, a tab inside a TSV text) is refused naming the file, the line and the counts,
  as is a CSV quote left open or followed by text. `lenient=True` (`--lenient-rows`) skips such rows instead, with
  a warning that counts them.
  CSV is RFC 4180 (quoted fields may hold commas, quotes doubled, line ends), with no limit on a field's length.
  TSV is one row a line, split on tabs, quotes kept as text: the GLUE convention (what GLUE's own readers,
  `csv.reader(quotechar=None)`, do; CoLA's `Susan whispered "Shut up".` stays as it is). The one exception is a
  field that is quoted the way pandas' `to_csv(sep="\t")` writes a text holding a quote, `"say ""hi"" now"`:
  a whole field in quotes with every inner quote doubled (at least one) is unquoted to `say "hi" now`. A quoted TSV
  field holding a tab or a line end is not supported: it splits the row, which the field count then refuses.
* Token classification: rows of words and tags (`tagged.py`, on `record_source`) or CoNLL column files — one word a line, the word in the first column and the tag in the
  last, blank lines between sentences, `-DOCSTART-` lines ignored. Labelled files must use a chunk scheme: `O`
  and `B-`/`I-` (IOB1 or IOB2) or `B-`/`I-`/`E-`/`S-` (BIOES) prefixes; `PERSON` alone is refused (file, line,
  tag).
* Extractive QA: SQuAD JSON files and flat rows, read in `squad.py` on this module's helpers.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..core.io import check_text, json_object
from ..data.tables import InMemory, Record, in_memory, is_path, refuse_description, table_format, table_records

log = logging.getLogger("bertforge")

# ---------------------------------------------------------------------------------------------------- examples


@dataclass
class TextExample:
    """One classification input: a text, an optional second text, and its label as written in the file."""

    text: str
    text_pair: str | None
    label: Any  # str / int / float as read; None when the file has no labels
    line: int  # 1-based line in the source file


@dataclass
class TaggedSentence:
    """One sentence of a CoNLL file: its words, their tags (None when unlabelled) and where it starts."""

    words: list[str]
    tags: list[str] | None
    line: int
    char_spans: list[tuple[int, int]] | None = None  # character offsets of each word, for raw-text input
    text: str | None = None
    row: bool = False  # read from a row (JSONL, Parquet, in memory): one line for all its words

    def word_line(self, k: int) -> str:
        """Where word `k` is, for messages: its line in a CoNLL file, or the row and the word's number."""
        return f"{self.line}, word {k + 1}" if self.row else str(self.line + k)


# ---------------------------------------------------------------------------------------------------- helpers


def file_path(data: Any) -> Path:
    """The path of a task file; rows in memory are refused (readers of records take them: `record_source`)."""
    if not is_path(data):
        raise BertforgeError(f"rows in memory ({type(data).__name__}) are not a CoNLL or SQuAD JSON file; this "
                             f"reader reads a file: pass its path (the tasks read rows through `record_source`)")
    refuse_description(data)
    return Path(data)


def read_text_file(path: str | Path) -> str:
    path = file_path(path)
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise BertforgeError(f"{path}: cannot read ({err.strerror})") from None
    check_text(path, data)  # a binary file is refused by name (task files are never read with replacement)
    try:
        text = data.decode("utf-8-sig")  # tolerate a byte-order mark
    except UnicodeDecodeError as err:
        raise BertforgeError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    if not text.strip():
        raise BertforgeError(f"{path}: the file is empty")
    return text


def file_format(path: str | Path) -> str:
    """"tsv", "jsonl", "parquet", "arrow" or "csv", from the file name."""
    suffix = Path(path).suffix.lower()
    if table_format(path):
        return table_format(path)  # type: ignore[return-value]
    if suffix in (".tsv", ".tab"):
        return "tsv"
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "csv"


# A TSV field quoted the way pandas writes a text holding a quote: quotes around it, every inner quote doubled.
_PANDAS_QUOTED = re.compile(r'"((?:[^"]|"")*)"')
# No limit on the length of a CSV field (the csv module's default is 131,072 characters), as for TSV and JSONL.
_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)


class _Skipped:
    """Malformed rows skipped by a lenient read: how many, and the first one's line and problem."""

    def __init__(self, path: Path, lenient: bool) -> None:
        self.path, self.lenient, self.count = path, lenient, 0
        self.first: tuple[int, str] | None = None

    def bad(self, start: int, end: int, problem: str) -> None:
        where = f"{start}" if end <= start else f"{start}-{end}"
        if not self.lenient:
            raise BertforgeError(f"{self.path}:{where}: {problem} (--lenient-rows skips malformed rows)")
        self.count += 1
        if self.first is None or start < self.first[0]:
            self.first = (start, f"line {where}: {problem}")

    def report(self) -> None:
        if self.count and self.first is not None:
            log.warning("%s: skipped %d malformed row%s (--lenient-rows); the first at %s", self.path, self.count,
                        "s" if self.count != 1 else "", self.first[1])


def _tsv_field(cell: str) -> str:
    match = _PANDAS_QUOTED.fullmatch(cell)
    if match and '""' in match.group(1):
        return match.group(1).replace('""', '"')
    return cell


def _csv_rows(path: Path, text: str, skipped: _Skipped) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, cells) of each row of a CSV file, strictly parsed: a quote left open or followed by
    text is a malformed row."""
    before = csv.field_size_limit(_FIELD_LIMIT)
    try:
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)  # line ends inside quoted cells are fine
        rows: list[tuple[int, int, list[str]]] = []
        end = 0
        while True:
            start = end + 1
            try:
                cells = next(reader)
            except StopIteration:
                break
            except csv.Error as err:
                end = reader.line_num
                if "unexpected end of data" in str(err):
                    problem = f"a quote opened on line {start} is never closed (an unbalanced quote)"
                else:
                    problem = f"malformed CSV ({err}: an unbalanced quote, or text after a closing quote)"
                skipped.bad(start, end, problem)
                continue
            end = reader.line_num
            rows.append((start, end, cells))
        return rows
    finally:
        csv.field_size_limit(before)


def table_rows(
    path: Path, text: str, no_header: bool, lenient: bool = False
) -> tuple[list[str] | None, list[tuple[int, list[str]]]]:
    """The header (None with `no_header`) and (line number, cells) for each non-blank row of a CSV/TSV file.

    Every row must have as many fields as the header (or the first row); a malformed row raises a BertforgeError
    naming the file, the line and what is wrong, or with `lenient` is skipped and counted in a warning.
    """
    skipped = _Skipped(path, lenient)
    tsv = file_format(path) == "tsv"
    if tsv:
        spans = [(n, n, [_tsv_field(c) for c in line.rstrip("\r").split("\t")])
                 for n, line in enumerate(text.split("\n"), 1)]
    else:
        spans = _csv_rows(path, text, skipped)
    spans = [(start, end, cells) for start, end, cells in spans if any(c.strip() for c in cells)]
    if not spans:
        raise BertforgeError(f"{path}: no rows")
    header = None if no_header else [c.strip() for c in spans[0][2]]
    expected = len(spans[0][2])
    what = "the header" if header is not None else "the first row"
    rows = []
    for start, end, cells in spans[0 if no_header else 1 :]:
        if len(cells) != expected:
            hint = ("a tab inside a text?" if tsv else "a comma inside a text that is not quoted?") if len(
                cells) > expected else ("a missing field?" if tsv else "a missing field, or a quote spanning lines?")
            skipped.bad(start, end, f"{len(cells)} field{'s' if len(cells) != 1 else ''}, but {what} has {expected} ({hint})")
            continue
        rows.append((end, cells))
    skipped.report()
    return header, rows


def _column_index(path: Path, header: list[str] | None, column: str, option: str) -> int:
    """Where `column` is: by name in the header, or as a 0-based index without one."""
    if header is None:
        if not column.isdigit():
            raise BertforgeError(f"{path}: without a header, {option} must be a column index (0, 1, ...), got {column!r}")
        return int(column)
    if column not in header:
        raise BertforgeError(f"{path}:1: no column {column!r} in the header (columns: {', '.join(header)})")
    return header.index(column)


def default_text_columns(columns: list[str]) -> tuple[str | None, str | None]:
    """The text (and pair) columns to use when none is given: "text", "sentence", or "sentence1" + "sentence2"."""
    for name in ("text", "sentence"):
        if name in columns:
            return name, None
    if "sentence1" in columns:
        return "sentence1", "sentence2" if "sentence2" in columns else None
    return None, None


# ---------------------------------------------------------------------------------------------------- classification


def read_classification(
    data: Any,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    label_column: str | None = "label",
    no_header: bool = False,
    require_labels: bool = True,
    lenient: bool = False,
    label_separator: str | None = None,
) -> list[TextExample]:
    """Read a CSV/TSV/JSONL/Parquet/Arrow classification file, or rows in memory (`bertforge.data.tables`).

    Args:
        text_column / text_pair_column: where the text (and the optional second text of a pair) is; a header name,
            a 0-based index with `no_header`, or a JSON key / column name. None picks "text", "sentence" or
            "sentence1" (and then "sentence2") when the data has them.
        label_column: where the label is. With `require_labels` False (prediction) the label is read when the
            column exists and otherwise left as None. A list there (JSONL, a Parquet list column, rows in memory)
            is a multi-label example's labels, any number of them.
        no_header: the CSV/TSV file has no header row (GLUE's CoLA files, for one).
        lenient: skip CSV/TSV rows with the wrong number of fields or broken quoting (counted in a warning)
            instead of refusing the file.
        label_separator: a text label is split on it into several labels (multi-label: "sports|politics"; an
            empty label is then an example with none).
    """
    source = record_source(data)
    if source is not None:
        path, records = source
        examples = _classification_records(path, records, text_column, text_pair_column, label_column, require_labels)
    else:
        path = Path(data)
        examples = _classification_table(path, text_column, text_pair_column, label_column, no_header,
                                         require_labels, lenient, empty_label_ok=label_separator is not None)
    if label_separator is not None:
        for example in examples:
            if isinstance(example.label, str):
                example.label = [part.strip() for part in example.label.split(label_separator) if part.strip()]
    return examples


def record_source(data: Any) -> tuple[Path, list[Record]] | None:
    """(what messages name, records) of data read as records: rows in memory (a list of dicts, a dict of lists,
    a `datasets.Dataset`), a Parquet or Arrow file, a JSONL file; None for a CSV or TSV file."""
    if not is_path(data):
        rows = data if isinstance(data, InMemory) else in_memory(data)
        return Path(rows.description), rows.records
    refuse_description(data)
    kind = file_format(data)
    if kind in ("parquet", "arrow"):
        return Path(data), table_records(data)
    if kind == "jsonl":
        return Path(data), jsonl_objects(Path(data), read_text_file(data))
    return None


def _classification_table(
    path: Path, text_column: str | None, text_pair_column: str | None, label_column: str | None, no_header: bool,
    require_labels: bool, lenient: bool, empty_label_ok: bool = False,
) -> list[TextExample]:
    """CSV/TSV examples; `require_labels` False still reads the label column when the header has it;
    `empty_label_ok` (labels split on a separator): an empty label is an example without labels."""
    header, rows = table_rows(path, read_text_file(path), no_header, lenient)
    if header is not None and text_column is None:
        text_column, guessed_pair = default_text_columns(header)
        text_pair_column = text_pair_column or guessed_pair
    if text_column is None:
        raise BertforgeError(f"{path}: name the text column with --text-column (no 'text' or 'sentence' column)")
    text_at = _column_index(path, header, text_column, "--text-column")
    pair_at = _column_index(path, header, text_pair_column, "--text-pair-column") if text_pair_column else None
    label_at = None
    if label_column is not None and (require_labels or (header is not None and label_column in header)):
        label_at = _column_index(path, header, label_column, "--label-column")
    needed = 1 + max(i for i in (text_at, pair_at, label_at) if i is not None)
    examples = []
    for line, cells in rows:
        if len(cells) < needed:
            raise BertforgeError(f"{path}:{line}: {len(cells)} column(s), expected at least {needed}")
        label = cells[label_at].strip() if label_at is not None else None
        if require_labels and label == "" and not empty_label_ok:
            at = label_at  # not None: the label was read
            labels = [row[at] for _, row in rows if at is not None and len(row) > at]
            raise BertforgeError(f"{path}:{line}: the label is empty{_multi_label_hint(labels)}")
        examples.append(TextExample(cells[text_at], cells[pair_at] if pair_at is not None else None, label, line))
    if not examples:
        raise BertforgeError(f"{path}: no examples (only a header?)")
    return examples


def _multi_label_hint(labels: list[str]) -> str:
    """What to add to "the label is empty" when the other labels look like several joined by a separator (a
    multi-label file read without --label-separator): which separator to pass."""
    joined = {sep: [label for label in labels if sep in label.strip()] for sep in ("|", ";", ",", "+")}
    sep, examples = max(joined.items(), key=lambda item: len(item[1]))
    if not examples:
        return ""
    return (f"; other labels hold several joined by {sep!r} (such as {examples[0].strip()!r}): a multi-label file? "
            f"Pass --label-separator '{sep}' (an empty label is then an example with no labels)")


def _classification_records(
    path: Path,
    records: list[Record],
    text_column: str | None,
    text_pair_column: str | None,
    label_column: str | None,
    require_labels: bool,
) -> list[TextExample]:
    examples = []
    for line, record in records:
        if text_column is None:
            text_column, guessed_pair = default_text_columns(list(record))
            text_pair_column = text_pair_column or guessed_pair
            if text_column is None:
                raise BertforgeError(f"{path}:{line}: name the text key with --text-column (no 'text' or 'sentence')")
        values: list[Any] = []  # the text (a str, its key checked above) and the optional pair
        for key in (text_column, text_pair_column):
            if key is None:
                values.append(None)
            elif not isinstance(record.get(key), str):
                problem = "no key" if key not in record else "not a string at key"
                raise BertforgeError(f"{path}:{line}: {problem} {key!r}")
            else:
                values.append(record[key])
        label = record.get(label_column) if label_column is not None else None
        if require_labels:
            if label_column not in record:
                raise BertforgeError(f"{path}:{line}: no key {label_column!r} (the label)")
            _check_label(path, line, label)
        examples.append(TextExample(values[0], values[1], list(label) if isinstance(label, tuple) else label, line))
    return examples


def _check_label(path: Path, line: int, label: Any) -> None:
    """A label is a non-empty string or a number; a multi-label example's, a list of them (empty: no label)."""
    for value in label if isinstance(label, (list, tuple)) else [label]:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or value == "":
            what = "each label in a list" if isinstance(label, (list, tuple)) else "the label"
            raise BertforgeError(f"{path}:{line}: {what} must be a non-empty string or a number, got {value!r}")


def jsonl_objects(path: Path, text: str) -> list[tuple[int, dict[str, Any]]]:
    records = []
    for line, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue
        records.append((line, json_object(raw, f"{path}:{line}")))
    if not records:
        raise BertforgeError(f"{path}: no examples")
    return records


# ---------------------------------------------------------------------------------------------------- CoNLL


def read_conll(path: str | Path, require_labels: bool = True) -> list[TaggedSentence]:
    """Read a CoNLL column file: word first, tag last, blank lines between sentences, `-DOCSTART-` skipped.

    Every word line must have as many columns as the first one. With `require_labels` False (prediction) a file
    of one column is words only; otherwise the file needs at least two columns.
    """
    path = file_path(path)
    text = read_text_file(path)
    sentences: list[TaggedSentence] = []
    words: list[str] = []
    tags: list[str] = []
    start = 0
    columns = 0

    def close() -> None:
        if words:
            sentences.append(TaggedSentence(list(words), list(tags) if columns > 1 else None, start))
        words.clear()
        tags.clear()

    for line, raw in enumerate(text.split("\n"), 1):
        cells = raw.split()
        if not cells:
            close()
            continue
        if cells[0] == "-DOCSTART-":
            close()
            continue
        if columns == 0:
            columns = len(cells)
            if require_labels and columns < 2:
                raise BertforgeError(f"{path}:{line}: one column only; expected the word first and the tag last")
        if len(cells) != columns:
            raise BertforgeError(f"{path}:{line}: {len(cells)} column(s), expected {columns} like the first line")
        if not words:
            start = line
        words.append(cells[0])
        tags.append(cells[-1])
    close()
    if not sentences:
        raise BertforgeError(f"{path}: no sentences")
    if require_labels:
        tag_scheme(path, sentences)
    return sentences


_TAG = re.compile(r"O|[BIES]-\S+")


def tag_scheme(path: str | Path, sentences: list[TaggedSentence]) -> str:
    """The chunk scheme of a labelled CoNLL file: "IOB1" (an entity may open with I-), "IOB2" (every entity opens
    with B-) or "BIOES" (E- and S- tags). A tag that is not `O` or a B-/I-/E-/S- prefix with a type (`PERSON`,
    `b-per`, `B-`), or E-/S- tags in a file whose entities also open with I-, is a BertforgeError naming the file,
    the line and the tag."""
    opens_with_i: tuple[str, str] | None = None  # (line, tag) of the first I- that opens an entity
    bioes: tuple[str, str] | None = None  # (line, tag) of the first E- or S-
    for sentence in sentences:
        previous = "O"
        for i, tag in enumerate(sentence.tags or []):
            line = sentence.word_line(i)
            if not _TAG.fullmatch(tag):
                raise BertforgeError(
                    f"{path}:{line}: tag {tag!r} is not an IOB or BIOES tag (expected O, or B-, I-, E- or S- and an "
                    f"entity type, e.g. B-PER)"
                )
            if tag[0] in "ES" and bioes is None:
                bioes = (line, tag)
            if tag[0] == "I" and opens_with_i is None and (previous == "O" or previous[2:] != tag[2:]
                                                            or previous[0] in "ES"):
                opens_with_i = (line, tag)
            previous = tag
    if bioes and opens_with_i:
        raise BertforgeError(
            f"{path}:{bioes[0]}: tag {bioes[1]!r} is BIOES, but line {opens_with_i[0]} opens an entity with "
            f"{opens_with_i[1]!r} (IOB1): one file, one tagging scheme"
        )
    return "BIOES" if bioes else "IOB1" if opens_with_i else "IOB2"
