"""Streaming corpus reader: documents out of text, gzip and JSON-lines files, in constant memory.

Formats
-------
* ``*.txt`` (and any explicitly named file that is not ``.jsonl``/``.gz``): documents are separated by one or
  more blank lines; inside a document every non-blank line is one sentence (or paragraph).
* ``*.gz``: the same, gzip-compressed (``*.jsonl.gz`` is JSON lines, compressed).
* ``*.jsonl``: one JSON object per line, one document per object; its ``text_column`` (default ``"text"``) holds
  the document, whose lines are the sentences.

Directories are walked recursively, in sorted order, taking ``.txt``, ``.gz`` and ``.jsonl`` files (hidden files
and folders are skipped). Files are read line by line in binary and decoded per line with ``errors="replace"``;
every byte that was not valid UTF-8 is counted in :attr:`CorpusReader.bytes_replaced`.

Binary files are refused: before reading, the first 64 KiB of every file (decompressed for ``.gz``) must look like
text (:func:`bertforge.core.io.binary_reason`: no NUL byte, no UTF-16 byte-order mark, at most 30 % control characters
or bytes that are not UTF-8). ``allow_binary=True`` (the ``--allow-binary`` option of ``pretrain`` and
``train-tokenizer``) reads them anyway, with replacement.

Sharding across data-parallel ranks
-----------------------------------
``shard_by="document"`` (the default): documents are numbered in corpus order (0, 1, 2, ... over all files) and
rank ``r`` of ``w`` keeps documents ``r, r + w, r + 2w, ...``. Ranks get disjoint, balanced data whatever the
number of files; each rank scans (but does not tokenize) the documents of the others.
``shard_by="file"``: rank ``r`` reads only files ``r, r + w, ...`` (needs at least ``w`` files). Cheaper I/O for
corpora made of many similar-sized files.

Held-out documents
------------------
``split=DocumentSplit(fraction, held_out)`` keeps only the documents outside (training) or inside (evaluation) a
held-out share of the corpus, chosen by a hash of each document's number: the same documents on every run,
whatever the seed or the number of ranks. Documents keep their numbers, so sharding and seeds are unchanged.

Resumable position
------------------
The reader's position is (epoch, file index, byte offset into the file's decompressed bytes, line number,
document number); :meth:`CorpusReader.state_dict` returns it as plain JSON and :meth:`load_state_dict` seeks
straight back to it (a plain file seeks in O(1); a gzip file re-decompresses up to the offset, which is no slower
than reading it).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, overload

from bertforge.data.decoding import decode_line, replace_surrogates, warn_replaced
from bertforge.core.errors import BertforgeError
from bertforge.core.io import check_text, json_object
from bertforge.core.state import DataChanged, check_same_files, files_fingerprint

CORPUS_SUFFIXES = (".txt", ".gz", ".jsonl")
DEFAULT_CORPUS = Path(__file__).with_name("default_corpus.txt.gz")

PathsLike = str | os.PathLike | Iterable[str | os.PathLike]


@functools.cache
def calibration_texts(n: int = 256) -> tuple[str, ...]:
    """`n` lines of more than five words from the bundled corpus, the same every time (every k-th such line): the
    text int8 quantisation calibrates on (`bertforge.model.quantize`). Read once per process."""
    with gzip.open(DEFAULT_CORPUS, "rt", encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if len(line.split()) > 5]
    step = max(1, len(lines) // n)
    return tuple(lines[::step][:n])


def calibration_ids(tokenizer: Any, n: int = 256, max_length: int = 128) -> list[list[int]]:
    """`calibration_texts(n)` encoded by `tokenizer` (special tokens added, cut at `max_length` tokens)."""
    return tokenizer(list(calibration_texts(n)), truncation=True, max_length=max_length)["input_ids"]


BINARY_HINT = "pass --allow-binary to read it anyway (invalid bytes are replaced)"


def check_corpus_files(files: list[Path]) -> None:
    """Refuse (BertforgeError naming the file) the first file whose first bytes are not text."""
    for path in files:
        check_text(path, hint=BINARY_HINT)


@dataclass(slots=True)
class Document:
    """One document: its sentences, and which document of the corpus it is."""

    sentences: list[str]
    index: int  # number of the document in corpus order (unique within an epoch), before sharding
    epoch: int
    source: str  # "file:line" of its first line, for messages


def _as_path_list(paths: PathsLike) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise BertforgeError("no corpus paths given")
    return out


def list_corpus_files(paths: PathsLike, suffixes: tuple[str, ...] = CORPUS_SUFFIXES) -> list[Path]:
    """Resolve files and directories (recursively, sorted; hidden names skipped) into the ordered list of corpus
    files: a directory contributes its files whose names end in one of `suffixes`."""
    files: list[Path] = []
    for path in _as_path_list(paths):
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for name in sorted(names):
                    if not name.startswith(".") and name.endswith(suffixes):
                        found.append(Path(root) / name)
            if not found:
                kinds = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
                raise BertforgeError(f"corpus directory {path} has no {kinds} files")
            files.extend(sorted(found, key=lambda p: p.relative_to(path).parts))
        elif path.exists():
            raise BertforgeError(f"corpus path {path} is neither a file nor a directory")
        else:
            raise BertforgeError(f"corpus path {path} does not exist")
    return files


def _is_jsonl(path: Path) -> bool:
    name = path.name
    return name.endswith(".jsonl") or name.endswith(".jsonl.gz")


@dataclass(frozen=True)
class DocumentSplit:
    """Document number i is held out when a hash of i falls below `fraction` (about that share of the documents,
    spread over the whole corpus); `held_out`: keep those (evaluation) rather than the others (training)."""

    fraction: float
    held_out: bool = False

    def keeps(self, index: int) -> bool:
        digest = hashlib.blake2b(index.to_bytes(8, "little"), digest_size=8, person=b"heldout").digest()
        return (int.from_bytes(digest, "little") < self.fraction * 2**64) == self.held_out


class CorpusReader:
    """Reads the documents of one rank's shard, cycling over the corpus forever (or once, with ``cycle=False``).

    ``min_docs``: at the end of every pass, fewer documents than this for this rank is an error (1: an empty
    corpus; 2: what next-sentence prediction needs, a "random other document").
    """

    def __init__(
        self,
        paths: PathsLike,
        *,
        text_column: str = "text",
        rank: int = 0,
        world_size: int = 1,
        shard_by: str = "document",
        min_docs: int = 1,
        cycle: bool = True,
        allow_binary: bool = False,
        split: DocumentSplit | None = None,
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise BertforgeError(f"rank {rank} is not in range for world_size {world_size}")
        if shard_by not in ("document", "file"):
            raise BertforgeError(f"shard_by must be 'document' or 'file', not {shard_by!r}")
        all_files = list_corpus_files(paths)
        if not allow_binary:
            check_corpus_files(all_files)
        if shard_by == "file":
            if len(all_files) < world_size:
                raise BertforgeError(
                    f"shard_by='file' needs at least one file per rank: {len(all_files)} files for "
                    f"world_size {world_size} (use shard_by='document')"
                )
            self.files = all_files[rank::world_size]
        else:
            self.files = all_files
        self.text_column, self.split, self.cycle, self.min_docs = text_column, split, cycle, min_docs
        self.rank, self.world_size, self.shard_by = rank, world_size, shard_by  # this rank's shard
        # position
        self.epoch = 0
        self.file_idx = 0
        self.offset = 0
        self.line_no = 0
        self.doc_index = 0  # documents seen (all ranks) in this epoch
        self.rank_docs = 0  # documents kept by this rank in this epoch
        self.docs_per_epoch: int | None = None  # known after the first full pass
        # statistics
        self.docs_read = 0
        self.bytes_read = 0
        self.bytes_replaced = 0
        self.first_replaced: str | None = None  # "file:line" of the first replaced byte (not saved in the state)
        self._fh: BinaryIO | None = None

    # ------------------------------------------------------------------ reading
    def _open(self) -> BinaryIO:
        path = self.files[self.file_idx]
        try:
            if path.name.endswith(".gz"):
                fh: BinaryIO = gzip.open(path, "rb")  # type: ignore[assignment]
            else:
                fh = open(path, "rb")
            if self.offset:
                fh.seek(self.offset)
        except FileNotFoundError:
            raise BertforgeError(f"corpus file {path} disappeared while reading") from None
        except (OSError, EOFError, zlib.error) as err:
            raise BertforgeError(f"corpus file {path}: cannot read it: {err}") from None
        return fh

    def _readline(self) -> bytes:
        if self._fh is None:
            self._fh = self._open()
        try:
            raw = self._fh.readline()
        except (OSError, EOFError, zlib.error) as err:
            raise BertforgeError(
                f"corpus file {self.files[self.file_idx]}: corrupt or truncated after line {self.line_no}: {err}"
            ) from None
        self.offset += len(raw)
        self.bytes_read += len(raw)
        if raw:
            self.line_no += 1
        return raw

    def _text(self, raw: bytes) -> str:
        text, replaced = decode_line(raw)
        if replaced:
            self.bytes_replaced += replaced
            self.first_replaced = self.first_replaced or f"{self.files[self.file_idx]}:{self.line_no}"
        if self.line_no == 1 and text.startswith("\ufeff"):
            text = text[1:]
        return text

    def _read_text_document(self) -> tuple[list[str], int] | None:
        sentences: list[str] = []
        first_line = 0
        while True:
            raw = self._readline()
            if not raw:
                return (sentences, first_line) if sentences else None
            line = self._text(raw).strip()
            if not line:
                if sentences:
                    return sentences, first_line
                continue
            if not sentences:
                first_line = self.line_no
            sentences.append(line)

    def _read_jsonl_document(self) -> tuple[list[str], int] | None:
        path = self.files[self.file_idx]
        while True:
            raw = self._readline()
            if not raw:
                return None
            line = self._text(raw).strip()
            if not line:
                continue
            record = json_object(line, f"{path}:{self.line_no}")
            if self.text_column not in record:
                fields = ", ".join(sorted(map(str, record))) or "none"
                raise BertforgeError(
                    f"{path}:{self.line_no}: no text field {self.text_column!r} (fields: {fields}); "
                    f"choose one with --text-column"
                )
            text = record[self.text_column]
            if text is None:
                continue
            if not isinstance(text, str):
                raise BertforgeError(
                    f"{path}:{self.line_no}: field {self.text_column!r} is {type(text).__name__}, not a string"
                )
            if b"\\u" in raw:  # only a JSON escape can put a surrogate into the text
                text, surrogates = replace_surrogates(text)
                self.bytes_replaced += surrogates * 6  # each was written as a 6-byte escape, \\udXXX
                if surrogates:
                    self.first_replaced = self.first_replaced or f"{path}:{self.line_no}"
            sentences = [s.strip() for s in text.splitlines()]
            sentences = [s for s in sentences if s]
            if sentences:
                return sentences, self.line_no

    def _end_of_pass(self) -> None:
        kept, total = self.rank_docs, self.doc_index
        if kept < self.min_docs:
            where = ", ".join(map(str, self.files[:3])) + (" ..." if len(self.files) > 3 else "")
            who = f" for rank {self.rank} of {self.world_size}" if self.world_size > 1 else ""
            if total == 0:
                raise BertforgeError(f"corpus {where} has no text{who}: every file is empty or blank")

            def docs(n: int) -> str:
                return f"{n} document{'s' if n != 1 else ''}"

            # what took the others: the held-out split, the sharding between ranks
            takers = []
            if kept < total and self.split is not None:
                fraction = self.split.fraction
                takers.append(f"the others fall outside the held-out fraction (--eval-fraction {fraction:g})"
                              if self.split.held_out else f"--eval-fraction {fraction:g} holds out the others")
            if kept < total and self.world_size > 1:
                takers.append(f"the others go to the other ranks of {self.world_size}")
            why = f" ({'; '.join(takers)})" if takers else ""
            if kept == 0:
                hint = " (a blank line ends a document: a corpus without blank lines is one)" if total == 1 else ""
                raise BertforgeError(f"corpus {where} has no document left to read{who}: 0 of its {docs(total)}{why}"
                                     f"{hint}")
            have = docs(kept) if kept == total else f"{kept} of its {docs(total)}"
            raise BertforgeError(
                f"corpus {where} has only {have}{who}{why}; next-sentence prediction needs at least "
                f"{self.min_docs} (separate documents with a blank line, or turn NSP off)"
            )
        if self.docs_per_epoch is None:
            self.docs_per_epoch = kept

    def next_document(self) -> Document | None:
        """The next document of this rank's shard; ``None`` only when ``cycle=False`` and the pass is over."""
        while True:
            if self.file_idx >= len(self.files):
                self._end_of_pass()
                if not self.cycle:
                    return None
                self.epoch += 1
                self.file_idx = self.offset = self.line_no = 0
                self.doc_index = self.rank_docs = 0
                continue
            read = self._read_jsonl_document if _is_jsonl(self.files[self.file_idx]) else self._read_text_document
            found = read()
            if found is None:
                self.close()
                self.file_idx += 1
                self.offset = self.line_no = 0
                continue
            sentences, first_line = found
            index = self.doc_index
            self.doc_index += 1
            if self.split is not None and not self.split.keeps(index):
                continue
            if self.shard_by == "document" and index % self.world_size != self.rank:
                continue
            self.rank_docs += 1
            self.docs_read += 1
            return Document(sentences, index, self.epoch, f"{self.files[self.file_idx]}:{first_line}")

    def __iter__(self) -> Iterator[Document]:
        while (doc := self.next_document()) is not None:
            yield doc

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # ------------------------------------------------------------------ state
    def position(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "file_idx": self.file_idx,
            "offset": self.offset,
            "line_no": self.line_no,
            "doc_index": self.doc_index,
            "rank_docs": self.rank_docs,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.position(),
            "docs_per_epoch": self.docs_per_epoch,
            "files": self._fingerprint(),
            "shard": [self.rank, self.world_size, self.shard_by],
            "stats": self.stats_dict(),
        }

    def seek(self, position: dict[str, Any]) -> None:
        self.close()
        for key in ("epoch", "file_idx", "offset", "line_no", "doc_index", "rank_docs"):
            setattr(self, key, int(position[key]))

    def _fingerprint(self) -> list[list[Any]]:
        """(file name, size) of every file: resuming checks the corpus is the same, wherever it now lives."""
        return files_fingerprint(self.files)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_same_files(state["files"], self._fingerprint(), "corpus")
        if list(state["shard"]) != [self.rank, self.world_size, self.shard_by]:
            raise DataChanged(
                f"cannot resume: checkpoint was rank/world_size/shard_by {state['shard']}, now "
                f"{[self.rank, self.world_size, self.shard_by]}"
            )
        self.seek(state)
        self.docs_per_epoch = state["docs_per_epoch"]
        self.load_stats(state["stats"])

    def stats_dict(self) -> dict[str, int]:
        return {"docs_read": self.docs_read, "bytes_read": self.bytes_read, "bytes_replaced": self.bytes_replaced}

    def load_stats(self, stats: dict[str, int]) -> None:
        self.docs_read = int(stats["docs_read"])
        self.bytes_read = int(stats["bytes_read"])
        self.bytes_replaced = int(stats["bytes_replaced"])


@overload
def iter_documents(paths: PathsLike, *, text_column: str = ..., rank: int = ..., world_size: int = ..., shard_by: str = ...,
                   as_documents: Literal[False] = ..., allow_binary: bool = ...) -> Iterator[str]: ...
@overload
def iter_documents(paths: PathsLike, *, text_column: str = ..., rank: int = ..., world_size: int = ..., shard_by: str = ...,
                   as_documents: Literal[True], allow_binary: bool = ...) -> Iterator[list[str]]: ...
def iter_documents(
    paths: PathsLike,
    *,
    text_column: str = "text",
    rank: int = 0,
    world_size: int = 1,
    shard_by: str = "document",
    as_documents: bool = False,
    allow_binary: bool = False,
) -> Iterator[str] | Iterator[list[str]]:
    """One pass over the corpus, for tokenizer training: yields each sentence line (or, with
    ``as_documents=True``, each document as its list of lines). Raises BertforgeError if nothing is yielded.
    Bytes that were not UTF-8 are reported in a warning when the pass ends (or the consumer stops early)."""
    reader = CorpusReader(
        paths, text_column=text_column, rank=rank, world_size=world_size, shard_by=shard_by, min_docs=1, cycle=False,
        allow_binary=allow_binary,
    )
    finished = False
    try:
        for doc in reader:
            if as_documents:
                yield doc.sentences
            else:
                yield from doc.sentences
        finished = True
    except GeneratorExit:  # the consumer took what it needed (a sample of the corpus)
        finished = True
        raise
    finally:
        reader.close()
        if finished:
            warn_replaced(reader.bytes_replaced, reader.first_replaced)


def take_mb(lines: Iterator[str], megabytes: float) -> Iterator[str]:
    """The first `megabytes` of a stream of lines (for training a vocabulary on a sample of a huge corpus)."""
    budget = int(megabytes * 1_000_000)
    for line in lines:
        yield line
        budget -= len(line) + 1
        if budget <= 0:
            return
