"""Rows that are not text files: Parquet and Arrow (IPC / Feather) files, and rows handed over in memory.

Every reader of task data (fine-tuning's classification files, `train-embeddings`' pair files, `embed`'s input)
reads CSV, TSV and JSONL itself and these through here, as *records*: (row number, {column: value}) in the
columns' order, numbered from 1 as a text file's lines are. They then go through the same checks as JSONL objects.

* Parquet (`.parquet`, `.pq`) and Arrow IPC (`.arrow`, `.feather`, `.ipc`, `.arrows`: the file format, Feather v2, or the
  stream format) are read with `pyarrow` (the `parquet` extra), one record batch at a time. A list column holds
  lists (a multi-label classification's labels).
* In memory (the Python API): a list of dicts, a dict of lists (columns of equal length), or a `datasets.Dataset`
  (recognised by its methods: `datasets` is never imported here). A run's settings file records such data as
  `<in-memory: N rows, sha256 …>` (`InMemory.description`): the same rows give the same description, so `resume`
  accepts them, but a run of in-memory data cannot be replayed from its settings file.
* Class names: a column of integer ids whose names travel with the data (a `datasets` ClassLabel feature, or a
  list of them: conll2003's `ner_tags`) is named by `class_names` — from a Dataset's `features`, or from the
  schema metadata that `Dataset.to_parquet` writes into a Parquet or Arrow file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError

Record = tuple[int, dict[str, Any]]  # (row number from 1, {column: value})

PYARROW_HINT = "pip install 'bertforge[parquet]'"
TABLE_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".arrow": "arrow", ".feather": "arrow", ".ipc": "arrow",
                 ".arrows": "arrow"}  # .arrows: the stream format's registered extension
BATCH_ROWS = 65_536  # rows converted to Python at a time (pyarrow's default batch size)
_DESCRIPTION = re.compile(r"<in-memory: [\d,]+ rows?, sha256 [0-9a-f]+>")


def table_format(path: str | Path) -> str | None:
    """"parquet" or "arrow" from the file name, else None (a text format)."""
    return TABLE_FORMATS.get(Path(path).suffix.lower())


def require_pyarrow(path: str | Path) -> Any:
    """The `pyarrow` module, or a one-line BertforgeError naming the install that provides it."""
    try:
        import pyarrow
    except ImportError:
        raise BertforgeError(f"{path}: reading Parquet or Arrow files needs pyarrow: {PYARROW_HINT}") from None
    return pyarrow


def table_records(path: str | Path) -> list[Record]:
    """The rows of a Parquet or Arrow IPC file as records, read one record batch at a time."""
    path = Path(path)
    pa = require_pyarrow(path)
    if not path.is_file():
        raise BertforgeError(f"{path}: no such file")
    records: list[Record] = []
    try:
        for batch in _batches(pa, path):
            first = len(records) + 1
            records.extend((first + i, row) for i, row in enumerate(batch.to_pylist()))
    except (pa.ArrowException, OSError) as err:
        kind = "a Parquet" if table_format(path) == "parquet" else "an Arrow IPC"
        raise BertforgeError(f"{path}: cannot read it as {kind} file ({str(err).splitlines()[0]})") from None
    if not records:
        raise BertforgeError(f"{path}: no rows")
    return records


def table_class_names(path: str | Path) -> dict[str, list[str]]:
    """{column: class names} of the ClassLabel columns recorded in a Parquet or Arrow file's schema metadata (what
    `datasets` writes: `{"info": {"features": ...}}`); {} when it records none."""
    pa = require_pyarrow(path)
    try:
        if table_format(path) == "parquet":
            import pyarrow.parquet as pq

            metadata = pq.read_schema(path).metadata
        else:
            metadata = next(iter(_batches(pa, Path(path)))).schema.metadata
    except (pa.ArrowException, OSError, StopIteration):
        return {}  # an unreadable file is reported by `table_records`
    try:
        features = json.loads((metadata or {}).get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return class_names(features)


def class_names(features: Any) -> dict[str, list[str]]:
    """{column: names} of the ClassLabel columns (or lists of ClassLabels) in `datasets` features as a dict
    (`Features.to_dict()`, or the schema metadata of a file that `datasets` wrote)."""
    names: dict[str, list[str]] = {}
    for column, feature in (features.items() if isinstance(features, Mapping) else ()):
        inner = feature.get("feature", feature) if isinstance(feature, Mapping) else None
        if isinstance(feature, list) and len(feature) == 1:  # a list holding one feature: a sequence of it
            inner = feature[0]
        if isinstance(inner, Mapping) and inner.get("_type") == "ClassLabel" and isinstance(inner.get("names"), list):
            names[column] = [str(n) for n in inner["names"]]
    return names


def record_batches(path: str | Path) -> Any:
    """The record batches of a Parquet or Arrow IPC file, one at a time (pyarrow `RecordBatch`es; nothing converted
    to Python): for readers that stream a file of any size."""
    return _batches(require_pyarrow(path), Path(path))


def _batches(pa: Any, path: Path) -> Any:
    if table_format(path) == "parquet":
        import pyarrow.parquet as pq

        yield from pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS)
        return
    import pyarrow.ipc as ipc

    with pa.memory_map(str(path)) as source:
        try:
            reader = ipc.open_file(source)
        except pa.ArrowInvalid:  # not the file format: the stream format
            source.seek(0)
            yield from ipc.open_stream(source)
            return
        for i in range(reader.num_record_batches):
            yield reader.get_batch(i)


# ---------------------------------------------------------------------------------------------------- in memory


def is_path(data: Any) -> bool:
    return isinstance(data, (str, os.PathLike))


@dataclass(frozen=True)
class InMemory:
    """Rows handed over in memory, as records, and what a settings file records of them."""

    records: list[Record]
    description: str
    class_names: dict[str, list[str]] = dataclasses.field(default_factory=dict)  # a Dataset's ClassLabel columns

    def __str__(self) -> str:
        return self.description


def in_memory(data: Any, what: str = "data") -> InMemory:
    """Rows from a list of dicts, a dict of lists or a `datasets.Dataset`; anything else is refused."""
    rows = _rows(data, what)
    if not rows:
        raise BertforgeError(f"{what}: no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise BertforgeError(f"{what}: row {i + 1} is a {type(row).__name__}, not a dict of columns")
    records = [(i + 1, dict(row)) for i, row in enumerate(rows)]
    digest = hashlib.sha256(json.dumps([r for _, r in records], sort_keys=True, default=repr).encode()).hexdigest()
    names = _dataset_class_names(data)
    if names:  # the same ids under other names are other data
        digest = hashlib.sha256((digest + json.dumps(names, sort_keys=True)).encode()).hexdigest()
    n = len(records)
    return InMemory(records, f"<in-memory: {n:,} row{'s' if n != 1 else ''}, sha256 {digest[:16]}>", names)


def _dataset_class_names(data: Any) -> dict[str, list[str]]:
    to_dict = getattr(getattr(data, "features", None), "to_dict", None)  # a datasets.Dataset's Features
    return class_names(to_dict()) if callable(to_dict) and hasattr(data, "column_names") else {}


def _rows(data: Any, what: str) -> list[Any]:
    if callable(getattr(data, "to_list", None)) and hasattr(data, "column_names"):  # a datasets.Dataset
        return data.to_list()
    if isinstance(data, Mapping):
        lengths = {k: len(v) if isinstance(v, (list, tuple)) else None for k, v in data.items()}
        if not data or None in lengths.values() or len(set(lengths.values())) != 1:
            raise BertforgeError(f"{what}: a dict of rows must map each column to a list, all of one length "
                                 f"(lengths: {lengths})")
        columns = list(data)
        return [dict(zip(columns, values)) for values in zip(*(data[c] for c in columns))]
    if isinstance(data, (list, tuple)):
        return list(data)
    raise BertforgeError(f"{what}: expected a file path, a list of dicts, a dict of lists or a datasets.Dataset, "
                         f"got {type(data).__name__}")


def is_description(value: Any) -> bool:
    """Whether a setting is the record of in-memory data (`InMemory.description`), not a path."""
    return isinstance(value, str) and _DESCRIPTION.fullmatch(value) is not None


def refuse_description(path: str | Path) -> None:
    """A settings file's record of in-memory data, given again as a path, is refused by name."""
    if is_description(str(path)) and not Path(path).exists():
        raise BertforgeError(f"{path} records data that was passed in memory: a run of in-memory data cannot be "
                             f"replayed from its settings file; pass the data again (from Python) or a file")


def split_in_memory(settings: Any, names: tuple[str, ...]) -> tuple[Any, dict[str, InMemory]]:
    """Settings whose `names` fields hold in-memory data get their description instead (a JSON string, what the
    settings file records); the data itself comes back by field name. A description given as a path (a settings
    file replayed) is refused."""
    for name in names:
        if is_path(getattr(settings, name)):
            refuse_description(getattr(settings, name))
    data = {name: in_memory(getattr(settings, name), name) for name in names
            if getattr(settings, name) is not None and not is_path(getattr(settings, name))}
    if not data:
        return settings, data
    return dataclasses.replace(settings, **{name: rows.description for name, rows in data.items()}), data
