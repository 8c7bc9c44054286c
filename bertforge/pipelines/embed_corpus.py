"""Embedding a corpus of any size into Parquet shards: streamed, resumable, shared among processes.

`embed_corpus(CorpusEmbedding(...), out)` reads a Parquet, Arrow, JSONL or text file, or a folder of them (sorted,
recursively, as pretraining's corpora), as a stream: Parquet by row group, the others line by line. Rows are
numbered by their *position* in the input (from 0, over all files in order) and cut into shards of `shard_rows`
consecutive positions: shard k holds positions [k·N, (k+1)·N). A shard's vectors depend on its rows only (its sort
windows never reach into the next shard), so which process embeds it, and when, never changes a bit of it.

The output directory holds:

* `shard-00000.parquet`, ...: columns `id` (the `id_column`'s values, else the row's position) and `embedding` (a
  fixed-size list of float32, float16 or int8; int8 adds `scale`, float32, with embedding ≈ int8 × scale per row).
  Each is written under a temporary name and renamed when complete; its footer records the run it belongs to, its
  row range and what it skipped or truncated.
* `embed-run.json`: the settings and the input's identity (each file's name and size, as pretraining records its
  corpus), written before the first shard; `resume=True` continues a run in place, redoing only missing shards, and
  refuses an input or a setting that changed since.
* `manifest.json`: written once, when every shard is complete: the model, pooling, normalisation, dimensions,
  the vectors' dtype, the input, the shards with their row ranges and the skipped and truncated rows. `read_embeddings`
  reads it back.

Shares: shard k belongs to share k mod `count`; a process embeds share `index` (`--num-shards K --shard-index I`,
and under torchrun each rank its own share of that: index I·W + rank of K·W). Every process reads the whole input
(the rows of other shares only as far as their ids, and a Parquet row group of none of its shards not at all), so
every process sees the same bad rows and duplicate ids. Whoever finds every shard complete writes the manifest; under
torchrun, rank 0 after the others.

Throughput: a background thread reads and tokenizes the next `sort_window` rows (sorted by length into packed
batches, as the pipeline does) while the model runs, and another writes the previous shard.

Bad rows (a missing or empty text, a row without an id, a duplicate id) are refused in one line naming the file and
row, or with `skip_bad_rows` skipped and counted. Rows longer than the model's limit are truncated and counted.
Memory: the rows of one sort window, the vectors of one shard and of the one being written; with `id_column`, also
one entry per row of the input for the duplicate check (the id itself, or 16 bytes of its hash).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import queue
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..core.constants import SHARD_ROWS, VECTOR_DTYPES
from ..core.errors import BertforgeError
from ..core.io import atomic_write, atomic_write_text, check_text, lock_run_directory
from ..core.state import DataChanged, check_same_files, files_fingerprint
from ..data.corpus import list_corpus_files
from ..data.tables import record_batches, require_pyarrow, table_format
from .base import CHUNK_SIZE

if TYPE_CHECKING:
    from ..core.system import Runtime
    from .base import Chunk
    from .embed import EmbedPipeline

log = logging.getLogger("bertforge")

INPUT_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc", ".jsonl", ".txt")
RUN_FILE = "embed-run.json"
MANIFEST = "manifest.json"
FORMAT = "bertforge-embeddings"
VERSION = 1
META_KEY = b"bertforge"  # the key of a shard's footer metadata
EXAMPLES_KEPT = 5  # bad rows named in each shard's record (and 4x that in the manifest)


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.parquet"


@dataclass(frozen=True)
class CorpusEmbedding:
    """What a run embeds and how: recorded in `embed-run.json`, and the same on resume. `model` and `input` are
    paths (a model directory; a file or a folder); the rest are `pipeline("embed")`'s settings, the output's
    `vector_dtype` (float32, float16 or int8), the `shard_rows` and `skip_bad_rows`."""

    model: str
    input: str
    text_column: str = "text"
    id_column: str | None = None  # None: the row's position in the input
    pooling: str | None = None
    normalize: bool | None = None
    layer: int = -1
    max_length: int | None = None
    prompt_name: str | None = None
    prompt: str | None = None
    quantize: str | None = None
    precision: str = "fp32"  # the model's compute: fp32, or bf16 on a CPU with bf16 units (the pipelines' `precision`)
    vector_dtype: str = "float32"  # the stored vectors
    shard_rows: int = SHARD_ROWS
    skip_bad_rows: bool = False

    def __post_init__(self) -> None:
        if self.vector_dtype not in VECTOR_DTYPES:
            raise BertforgeError(f"vector_dtype must be one of {', '.join(VECTOR_DTYPES)}, got {self.vector_dtype!r}")
        if isinstance(self.shard_rows, bool) or not isinstance(self.shard_rows, int) or self.shard_rows < 1:
            raise BertforgeError(f"shard_rows must be a positive integer, got {self.shard_rows!r}")


@dataclass(frozen=True)
class Share:
    """The shards a process embeds: those k with k mod `count` == `index`."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise BertforgeError(f"shard index {self.index} is not in 0..{self.count - 1} (--num-shards {self.count})")

    def owns(self, shard: int) -> bool:
        return shard % self.count == self.index

    def under(self, rank: int, world_size: int) -> Share:
        """This share divided among `world_size` processes (torchrun's ranks): rank `rank`'s part."""
        return Share(self.index * world_size + rank, self.count * world_size)


@dataclass
class ShardRecord:
    """What one shard holds, kept in its footer and in the manifest."""

    shard: int
    rows: tuple[int, int]  # input positions [start, end)
    count: int = 0  # rows embedded
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> rows
    truncated: int = 0
    examples: list[str] = field(default_factory=list)  # "FILE, row N: reason" of the first skipped rows

    def as_json(self) -> dict[str, Any]:
        """The record as the footer keeps it (the manifest lists the same, less the examples)."""
        return {"shard": self.shard, "rows": list(self.rows), "count": self.count,
                "skipped": dict(sorted(self.skipped.items())), "truncated": self.truncated, "examples": self.examples}


# ---------------------------------------------------------------------------------------------------- reading rows


@dataclass(slots=True)
class Row:
    position: int  # in the input, from 0 over every file
    source: Path
    number: int  # the row (Parquet, Arrow) or line (JSONL, text) of its file, from 1
    id: Any
    text: Any  # None: not read (another share's row)

    @property
    def where(self) -> str:
        """"FILE, row N" or "FILE, line N", for messages."""
        unit = "row" if table_format(self.source) else "line"
        return f"{self.source}, {unit} {self.number}"


MISSING = object()  # a JSON object without the text key


def input_files(path: str | Path) -> list[Path]:
    """The files of `path`: itself, or a folder's Parquet, Arrow, JSONL and text files (sorted, recursively)."""
    files = list_corpus_files(path, INPUT_SUFFIXES)
    for file in files:
        if not file.name.lower().endswith(INPUT_SUFFIXES):
            raise BertforgeError(f"{file}: input must be a .txt (one text a line), .jsonl, Parquet or Arrow file")
    return files


def read_rows(files: list[Path], text_column: str, id_column: str | None,
              wanted: Callable[[int, int], bool], totals: dict[str, int] | None = None) -> Iterator[Row]:
    """Every row of the input in order. `wanted(start, end)`: whether any position in [start, end) is needed; the
    rows of a Parquet row group that is not come without their text (and are not read at all without an id column).
    At the end `totals["rows"]` is the number of rows of the input."""
    position = 0
    for path in files:
        if table_format(path):
            table = _TableRows(path, position, text_column, id_column, wanted)
            yield from table
            position = table.end  # its row groups of no wanted position were counted, not read
        else:
            for row in _line_rows(path, position, text_column, id_column, wanted):
                yield row
                position = row.position + 1
    if totals is not None:
        totals["rows"] = position


class _TableRows:
    """The rows of a Parquet or Arrow file; `end` is the position after its last row once iterated."""

    def __init__(self, path: Path, start: int, text_column: str, id_column: str | None,
                 wanted: Callable[[int, int], bool]) -> None:
        self.path, self.start, self.end = path, start, start
        self.text_column, self.id_column, self.wanted = text_column, id_column, wanted

    def check_columns(self, names: list[str]) -> None:
        for column, option in ((self.text_column, "--text-column"), (self.id_column, "--id-column")):
            if column is not None and column not in names:
                raise BertforgeError(f"{self.path}: no column {column!r} ({option} names it); its columns: "
                                     f"{', '.join(names)}")

    def rows(self, position: int, batch: Any, with_text: bool) -> Iterator[Row]:
        ids = batch.column(self.id_column).to_pylist() if self.id_column else None
        texts = batch.column(self.text_column).to_pylist() if with_text else None
        for i in range(batch.num_rows):
            yield Row(position + i, self.path, position + i - self.start + 1,
                      ids[i] if ids is not None else position + i, texts[i] if texts is not None else None)

    def __iter__(self) -> Iterator[Row]:
        pa = require_pyarrow(self.path)
        position = self.start
        try:
            if table_format(self.path) == "parquet":
                import pyarrow.parquet as pq

                parquet = pq.ParquetFile(self.path)
                self.check_columns(parquet.schema_arrow.names)
                columns = [c for c in (self.text_column, self.id_column) if c is not None]
                for group in range(parquet.num_row_groups):
                    n = parquet.metadata.row_group(group).num_rows
                    if self.wanted(position, position + n):
                        for batch in parquet.iter_batches(batch_size=CHUNK_SIZE, row_groups=[group], columns=columns):
                            yield from self.rows(position, batch, True)
                            position += batch.num_rows
                    elif self.id_column is not None:  # another share's rows: their ids only
                        ids = parquet.read_row_group(group, columns=[self.id_column])
                        yield from self.rows(position, ids, False)
                        position += n
                    else:
                        position += n
            else:
                for batch in record_batches(self.path):
                    self.check_columns(batch.schema.names)
                    yield from self.rows(position, batch, self.wanted(position, position + batch.num_rows))
                    position += batch.num_rows
        except (pa.ArrowException, OSError) as err:
            kind = "a Parquet" if table_format(self.path) == "parquet" else "an Arrow IPC"
            raise BertforgeError(f"{self.path}: cannot read it as {kind} file ({str(err).splitlines()[0]})") from None
        self.end = position


def _line_rows(path: Path, start: int, text_column: str, id_column: str | None,
               wanted: Callable[[int, int], bool]) -> Iterator[Row]:
    """A text file's lines (every one a row, empty ones too) or a JSONL file's non-blank lines, read one at a time;
    a JSONL line of no wanted position is not parsed unless its id is needed."""
    jsonl = path.suffix.lower() == ".jsonl"
    if id_column is not None and not jsonl:
        raise BertforgeError(f"{path}: a text file has no columns; --id-column needs JSONL, Parquet or Arrow input")
    check_text(path)
    position = start
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise BertforgeError(f"{path}, line {number}: not UTF-8 text (byte 0x{raw[err.start]:02x}); convert "
                                     f"it first, e.g. `iconv -f latin1 -t utf-8`") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            line = line.removesuffix("\n").removesuffix("\r")
            if not jsonl:
                yield Row(position, path, number, position, line)
            elif not line.strip():
                continue
            elif id_column is None and not wanted(position, position + 1):
                yield Row(position, path, number, position, None)  # another share's row: only counted
            else:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise BertforgeError(f"{path}, line {number}: not valid JSON ({err.msg})") from None
                if isinstance(record, dict):
                    text = record.get(text_column, MISSING)
                    ident = record.get(id_column) if id_column is not None else position
                else:
                    text, ident = record, (None if id_column is not None else position)
                yield Row(position, path, number, ident, text)
            position += 1


Problem = tuple[str, str]  # (the kind the manifest counts, the message)


def bad_text(text: Any, text_column: str) -> Problem | None:
    """Why a row's text cannot be embedded, or None."""
    if text is MISSING:
        return "no text", f"no {text_column!r}"
    if text is None:
        return "no text", "no text (null)"
    if not isinstance(text, str):
        return "not a string", f"the text is a {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text", "empty text"
    return None


class IdCheck:
    """Ids seen so far (the id itself, or 16 bytes of its hash for a long string): a later row with one is a
    duplicate. Every row's id counts, its text good or not, so that every process agrees."""

    def __init__(self) -> None:
        self.seen: set[Any] = set()
        self.kind: type | None = None

    def problem(self, ident: Any) -> Problem | None:
        if ident is None:
            return "no id", "no id (null)"
        if isinstance(ident, bool) or not isinstance(ident, (int, str)):
            return "bad id", f"the id is a {type(ident).__name__}, not an integer or a string"
        if self.kind is None:
            self.kind = type(ident)
        elif type(ident) is not self.kind:
            return "bad id", f"the id {ident!r} is not a{'n integer' if self.kind is int else ' string'} as the first row's"
        key = ident if isinstance(ident, int) or len(ident) <= 16 else hashlib.blake2b(
            ident.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if key in self.seen:
            return "duplicate id", f"duplicate id {ident!r} (an earlier row has it)"
        self.seen.add(key)
        return None


# ---------------------------------------------------------------------------------------------------- the run


def fingerprint(settings: CorpusEmbedding, files: list[Path], model_dir: Path | None) -> dict[str, Any]:
    """What a resumed run must find unchanged: the settings, the input files and the model's files."""
    model_files = [] if model_dir is None else sorted(
        p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".json") or p.name == "vocab.txt")
    return {"settings": dataclasses.asdict(settings), "input_files": files_fingerprint(files),
            "model_files": files_fingerprint(model_files)}


def run_id(identity: dict[str, Any]) -> str:
    return hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=8).hexdigest()


def recorded_settings(out: str | Path) -> CorpusEmbedding:
    """The settings of the run in `out` (its `embed-run.json`), for `resume`."""
    record = _read_run_file(Path(out))
    try:
        return CorpusEmbedding(**record["settings"])
    except TypeError as err:
        raise BertforgeError(f"{Path(out) / RUN_FILE}: not a run file of this bertforge ({err})") from None


def _read_run_file(out: Path) -> dict[str, Any]:
    path = out / RUN_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertforgeError(f"{out}: no embedding run to resume ({RUN_FILE} is missing)") from None
    except (OSError, ValueError) as err:
        raise BertforgeError(f"{path}: unreadable ({err})") from None
    if not isinstance(record, dict) or record.get("version") != VERSION or "settings" not in record:
        raise BertforgeError(f"{path}: not an embedding run file of this bertforge (version {VERSION})")
    return record


def check_same_run(then: dict[str, Any], now: dict[str, Any], out: Path) -> None:
    """Refuse to continue the run recorded in `out` with other settings, input or model, naming what changed."""
    check_same_files(then["input_files"], now["input_files"], "input")
    changed = [f"{name} was {then['settings'].get(name)!r}, is {value!r}"
               for name, value in now["settings"].items() if then["settings"].get(name) != value]
    if changed:
        raise BertforgeError(f"cannot resume {out}: the settings differ from the run's ({'; '.join(changed)}); "
                             f"resume with the run's settings, or choose another --out")
    if then["model_files"] != now["model_files"]:
        raise DataChanged(f"cannot resume {out}: the model's files differ from the run's (then "
                          f"{then['model_files']}, now {now['model_files']}); resume with the run's model")


def shard_record(path: Path, run: str) -> ShardRecord | None:
    """The record in a complete shard's footer, or None when `path` is missing or belongs to another run."""
    import pyarrow.parquet as pq

    pa = require_pyarrow(path)
    try:
        metadata = pq.read_schema(path).metadata or {}
        record = json.loads(metadata[META_KEY])
    except (OSError, KeyError, ValueError, TypeError, pa.ArrowException):  # missing, unreadable, not ours
        return None
    if record.get("run") != run:
        return None
    return ShardRecord(record["shard"], tuple(record["rows"]), record["count"], Counter(record["skipped"]),
                       record["truncated"], record["examples"])


def vector_columns(vectors: np.ndarray, dtype: str) -> dict[str, Any]:
    """The `embedding` column (a fixed-size list) of `vectors` [n, d] stored as `dtype`, and int8's `scale`."""
    pa = require_pyarrow("the output")
    n, d = vectors.shape
    columns: dict[str, Any] = {}
    if dtype == "int8":
        peak = np.abs(vectors).max(axis=1) if n else np.zeros(0, np.float32)
        scale = np.where(peak > 0, peak / 127.0, 1.0).astype(np.float32)
        values = np.clip(np.rint(vectors / scale[:, None]), -127, 127).astype(np.int8)
        columns["scale"] = pa.array(scale, type=pa.float32())
    else:
        values = vectors.astype(np.float16 if dtype == "float16" else np.float32)
    flat = pa.array(values.reshape(-1))
    columns = {"embedding": pa.FixedSizeListArray.from_arrays(flat, d), **columns}
    return columns


def write_shard(path: Path, ids: list[Any], id_kind: str, vectors: np.ndarray, dtype: str,
                record: dict[str, Any]) -> None:
    """One shard, atomically: written under a temporary name beside `path`, renamed when complete."""
    pa = require_pyarrow(path)
    import pyarrow.parquet as pq

    columns = {"id": pa.array(ids, type=pa.int64() if id_kind == "int64" else pa.string()),
               **vector_columns(vectors, dtype)}
    table = pa.table(columns).replace_schema_metadata({META_KEY: json.dumps(record).encode()})
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def read_embeddings(out: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(ids, vectors) of a complete output directory, in input order: the vectors as float32 [n, d] (int8 rows
    multiplied back by their scale)."""
    require_pyarrow(out)
    import pyarrow.parquet as pq

    out = Path(out)
    try:
        manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertforgeError(f"{out}: no {MANIFEST} (the run is not complete, or this is not an embedding "
                             f"output)") from None
    ids, vectors = [], []
    for entry in manifest["shards"]:
        table = pq.read_table(out / entry["file"])
        flat = table.column("embedding").combine_chunks().flatten().to_numpy(zero_copy_only=False)
        rows = flat.reshape(table.num_rows, manifest["dimensions"]).astype(np.float32)
        if "scale" in table.column_names:
            rows = rows * table.column("scale").to_numpy()[:, None]
        ids.append(table.column("id").to_numpy(zero_copy_only=False))
        vectors.append(rows)
    d = manifest["dimensions"]
    return (np.concatenate(ids) if ids else np.zeros(0, np.int64),
            np.concatenate(vectors) if vectors else np.zeros((0, d), np.float32))


@dataclass
class _Window:
    """Rows of one shard tokenized together; the last window of a shard carries the shard's record."""

    ids: list[Any]
    chunk: Chunk | None
    id_kind: str = "int64"  # "int64" or "string": the shard's id column
    record: ShardRecord | None = None  # set on the shard's last window


class CorpusRun:
    """One process's part of an embedding run (see the module's docstring); `run()` embeds its missing shards.

    `share`: this process's share of the shards (`--num-shards`, `--shard-index`); under torchrun (`runtime` with
    several ranks) each rank takes its part of it. `pipe`: an embed pipeline to use instead of one built from the
    settings (it must be the settings' model). The other options change how fast, not what."""

    def __init__(self, settings: CorpusEmbedding, out: str | Path, *, resume: bool = False, share: Share = Share(),
                 max_batch_tokens: int = 4096, sort_window: int | None = None, device: str | None = None,
                 threads: int | None = None, progress: bool | None = None, runtime: Runtime | None = None,
                 pipe: EmbedPipeline | None = None) -> None:
        from . import pipeline

        sort_window = CHUNK_SIZE if sort_window is None else sort_window
        if isinstance(sort_window, bool) or not isinstance(sort_window, int) or sort_window < 1:
            raise BertforgeError(f"sort_window must be a positive number of rows, got {sort_window!r}")
        self.settings, self.out, self.resume = settings, Path(out), resume
        self.rt = runtime
        world, rank = (runtime.world_size, runtime.rank) if runtime is not None else (1, 0)
        self.share = share.under(rank, world)
        self.is_main = rank == 0
        self.sort_window, self.progress = sort_window, progress
        if self.out.exists() and not self.out.is_dir():
            raise BertforgeError(f"--out {self.out} is a file: shards go into a directory (a .npy name writes one "
                                 f"array instead)")
        require_pyarrow(self.out)
        self.files = input_files(settings.input)
        source = Path(settings.input).resolve()
        if self.out.resolve() == source or (source.is_dir() and self.out.resolve().is_relative_to(source)):
            raise BertforgeError(f"--out {self.out} is inside the input {settings.input}: its shards would become "
                                 f"input; choose a directory outside it")
        if pipe is None:
            if runtime is not None and runtime.device.type == "cuda":
                device = str(runtime.device)  # under torchrun: this rank's GPU
            pipe = pipeline(  # type: ignore[assignment]
                "embed", model=settings.model, pooling=settings.pooling, normalize=settings.normalize,
                layer=settings.layer, max_length=settings.max_length, max_batch_tokens=max_batch_tokens,
                num_threads=threads, progress=False, quantize=settings.quantize, device=device,
                prompt_name=settings.prompt_name, prompt=settings.prompt, precision=settings.precision)
        assert pipe is not None
        self.pipe = pipe
        model_dir = pipe.model_dir
        if model_dir is not None and self.out.resolve().is_relative_to(model_dir.resolve()):
            raise BertforgeError(f"--out {self.out} is inside the model directory {model_dir}; choose another")
        self.identity = fingerprint(settings, self.files, model_dir)
        self.run_name = run_id(self.identity)
        self.totals: dict[str, int] = {}

    # ------------------------------------------------------------------ the run file
    def start(self) -> None:
        """Write the run file (rank 0, if there is none) or check the one there: another run, or this one with other
        settings or input, is refused; without `resume`, only another share's process may join a run."""
        run_file = self.out / RUN_FILE
        created = False
        if not run_file.exists():
            if self.resume:
                raise BertforgeError(f"{self.out}: no embedding run to resume ({RUN_FILE} is missing)")
            if self.out.exists() and any(not p.name.startswith(".") for p in self.out.iterdir()):
                raise BertforgeError(f"{self.out} is not empty and holds no embedding run; choose a new directory")
            if not self.is_main:
                raise BertforgeError(f"{self.out}: rank 0 wrote no {RUN_FILE}")
            record = {"format": FORMAT, "version": VERSION, "run": self.run_name, **self.identity}
            staged = self.out / f".{RUN_FILE}.{os.getpid()}.new"
            atomic_write_text(staged, json.dumps(record, indent=1) + "\n")
            try:  # exclusive: of several processes starting at once, one writes it and the others join
                os.link(staged, run_file)
                created = True
            except FileExistsError:
                pass
            finally:
                staged.unlink(missing_ok=True)
        then = _read_run_file(self.out)
        joining = self.share.count > 1 and then.get("run") == self.run_name
        if not (created or self.resume or joining):
            raise BertforgeError(f"{self.out} holds an embedding run already; --resume continues it, or choose "
                                 f"another --out")
        check_same_run(then, self.identity, self.out)
        if joining and not self.resume and not created and self.done_shards():
            raise BertforgeError(f"{self.out}: shards of share {self.share.index} of {self.share.count} are there "
                                 f"already; --resume continues them")

    def done_shards(self) -> set[int]:
        """This share's shards that are complete in `out` (of this run)."""
        done = set()
        for path in self.out.glob("shard-*.parquet"):
            try:
                k = int(path.stem.removeprefix("shard-"))
            except ValueError:
                continue
            if self.share.owns(k) and shard_record(path, self.run_name) is not None:
                done.add(k)
        return done

    def clean_temporaries(self) -> None:
        """Remove the shards of this share a killed process left half-written (under their temporary names)."""
        for path in self.out.glob(".shard-*.parquet.*.tmp"):
            try:
                k = int(path.name.split(".")[1].removeprefix("shard-"))
            except ValueError:
                continue
            if self.share.owns(k):
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ reading and tokenizing (background)
    def windows(self, done: set[int], stop: threading.Event) -> Iterator[_Window]:
        """This share's rows, checked, in windows of at most `sort_window` rows of one shard, tokenized and packed."""
        s, n = self.settings, self.settings.shard_rows

        def wanted(start: int, end: int) -> bool:
            return any(self.share.owns(k) and k not in done for k in range(start // n, (end - 1) // n + 1))

        ids_check = IdCheck() if s.id_column is not None else None
        record: ShardRecord | None = None
        ids: list[Any] = []
        texts: list[str] = []

        def flush(last: bool) -> _Window:
            nonlocal ids, texts
            chunk = self.pipe.prepare(texts, 0) if texts else None
            if record is not None and chunk is not None:
                record.truncated += chunk.truncated
            kind = "string" if ids_check is not None and ids_check.kind is str else "int64"
            window = _Window(ids, chunk, kind, record if last else None)
            ids, texts = [], []
            return window

        for row in read_rows(self.files, s.text_column, s.id_column, wanted, self.totals):
            if stop.is_set():
                return
            k = row.position // n
            problem = ids_check.problem(row.id) if ids_check is not None else None  # every row's id counts
            if record is not None and k != record.shard:
                yield flush(True)
                record = None
            if not self.share.owns(k) or k in done:
                continue
            if record is None:
                record = ShardRecord(k, (k * n, k * n + n))
            problem = problem or bad_text(row.text, s.text_column)
            if problem is not None:
                kind, message = problem
                if not s.skip_bad_rows:
                    raise BertforgeError(f"{row.where}: {message}; --skip-bad-rows skips such rows (counted in the "
                                         f"manifest)")
                record.skipped[kind] += 1
                if len(record.examples) < EXAMPLES_KEPT:
                    record.examples.append(f"{row.where}: {message}")
                continue
            ids.append(row.id)
            texts.append(row.text)
            if len(texts) >= self.sort_window:
                yield flush(False)
        if record is not None:
            record.rows = (record.rows[0], min(record.rows[1], self.totals["rows"]))
            yield flush(True)

    def background(self, done: set[int]) -> Iterator[_Window]:
        """`windows`, made in a thread up to two windows ahead of the model."""
        ahead: queue.Queue[Any] = queue.Queue(maxsize=2)
        stop = threading.Event()
        end = object()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    ahead.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                for window in self.windows(done, stop):
                    if not put(window):
                        return
                put(end)
            except BaseException as err:  # handed to the consumer, raised there
                put(err)

        thread = threading.Thread(target=produce, name="bertforge-embed-read", daemon=True)
        thread.start()
        try:
            while True:
                item = ahead.get()
                if item is end:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            thread.join()

    # ------------------------------------------------------------------ the run
    def rows_to_embed(self, done: set[int]) -> int | None:
        """Rows this process will read for its shards, when the input says so without being read (Parquet)."""
        if not all(table_format(f) == "parquet" for f in self.files):
            return None
        import pyarrow.parquet as pq

        total = sum(pq.ParquetFile(f).metadata.num_rows for f in self.files)
        n = self.settings.shard_rows
        return sum(min(n, total - k * n) for k in range(math.ceil(total / n)) if self.share.owns(k) and k not in done)

    def run(self) -> dict[str, Any]:
        """Embed this process's missing shards; write the manifest when every shard is complete. Returns a summary:
        `rows` and `shards` embedded here, `kept` (shards complete before), `manifest` (whether it was written
        here), `input_rows`, `skipped` and `truncated` rows of the shards written here."""
        from ..core.system import all_ranks_agree

        lock = lock_run_directory(self.out / f"share-{self.share.index}-of-{self.share.count}", "embed")
        try:
            self._on_main(self.start)
            self.clean_temporaries()
            done = self.done_shards()
            summary = self._embed(done)
        finally:
            lock.release()
        summary["kept"], summary["input_rows"] = len(done), self.totals["rows"]
        if self.rt is not None and self.rt.distributed:
            all_ranks_agree(self.rt, True)  # every rank's shards are written: rank 0 writes the manifest
        summary["manifest"] = self.is_main and self.write_manifest()
        return summary

    def _on_main(self, step: Callable[[], None]) -> None:
        """`step` on rank 0, then (after it) on the others; at once without a process group."""
        if self.rt is None or not self.rt.distributed:
            step()
            return
        from ..core.system import on_every_rank, on_main

        on_main(self.rt, step)  # its agreement is the barrier: the run file is there for the others
        if not self.is_main:
            on_every_rank(self.rt, step)
        else:
            on_every_rank(self.rt, lambda: None)

    def _embed(self, done: set[int]) -> dict[str, Any]:
        s = self.settings
        bar = None
        if self.progress is not False and self.is_main:
            from tqdm.auto import tqdm

            bar = tqdm(total=self.rows_to_embed(done), desc="embed", unit="row",
                       disable=None if self.progress is None else False, dynamic_ncols=True)
        summary: dict[str, Any] = {"rows": 0, "shards": 0, "skipped": Counter(), "truncated": 0}
        vectors: list[np.ndarray] = []
        ids: list[Any] = []
        pending: Future[None] | None = None
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-embed-write") as writer:
            try:
                for window in self.background(done):
                    if window.chunk is not None:
                        rows = self.pipe.compute(window.chunk)
                        vectors.extend(rows)
                        ids.extend(window.ids)
                        if bar is not None:
                            bar.update(len(rows))
                        summary["rows"] += len(rows)
                    record = window.record
                    if record is None:
                        continue
                    record.count = len(ids)
                    matrix = np.stack(vectors) if vectors else np.zeros((0, self.pipe.vector_size()), np.float32)
                    meta = {"run": self.run_name, **record.as_json()}
                    if pending is not None:
                        pending.result()  # one shard written at a time, while the next is embedded
                    pending = writer.submit(write_shard, self.out / shard_name(record.shard), ids, window.id_kind,
                                            matrix, s.vector_dtype, meta)
                    summary["shards"] += 1
                    summary["skipped"].update(record.skipped)
                    summary["truncated"] += record.truncated
                    vectors, ids = [], []
                if pending is not None:
                    pending.result()
            finally:
                if bar is not None:
                    bar.close()
        return summary

    def write_manifest(self) -> bool:
        """The manifest, when every shard of the run is complete; False (nothing written) while one is missing."""
        import pyarrow.parquet as pq

        s, pipe, input_rows = self.settings, self.pipe, self.totals["rows"]
        if input_rows == 0:
            raise BertforgeError(f"{s.input}: no rows")
        records = []
        for k in range(math.ceil(input_rows / s.shard_rows)):
            record = shard_record(self.out / shard_name(k), self.run_name)
            if record is None:
                return False
            records.append(record)
        skipped: Counter[str] = Counter()
        for r in records:
            skipped.update(r.skipped)
        first = next((r for r in records if r.count), records[0])
        id_type = str(pq.read_schema(self.out / shard_name(first.shard)).field("id").type)
        shards = []
        for r in records:
            entry = r.as_json()
            del entry["examples"]
            shards.append({"file": shard_name(r.shard), **entry})
        manifest = {
            "format": FORMAT, "version": VERSION, "run": self.run_name,
            "model": s.model, "pooling": pipe.pooling, "normalize": pipe.normalize, "layer": pipe.layer,
            "max_length": pipe.max_length, "prompt": pipe.prompt, "quantize": pipe.quantize,
            "dimensions": pipe.vector_size(), "vector_dtype": s.vector_dtype,
            "id": {"column": s.id_column, "type": id_type},
            "input": {"path": s.input, "text_column": s.text_column, "files": self.identity["input_files"]},
            "rows": {"input": input_rows, "embedded": sum(r.count for r in records),
                     "skipped": dict(sorted(skipped.items())), "truncated": sum(r.truncated for r in records),
                     "examples": [e for r in records for e in r.examples][: 4 * EXAMPLES_KEPT]},
            "shard_rows": s.shard_rows,
            "shards": shards,
        }
        atomic_write_text(self.out / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        return True


def embed_corpus(settings: CorpusEmbedding, out: str | Path, **options: Any) -> dict[str, Any]:
    """Embed `settings.input` into shards in `out` (see the module's docstring); `options`: `CorpusRun`'s."""
    return CorpusRun(settings, out, **options).run()
