"""`bertforge embed`: sentence embeddings of every line of a .txt file (or text of a .jsonl, Parquet or Arrow file)
into a .npy file, or of a corpus of any size (a file or a folder, streamed) into Parquet shards and a manifest
(`bertforge.pipelines.embed_corpus`: resumable, shared among processes and torchrun's ranks)."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from ..core.constants import POOLINGS, SHARD_ROWS, VECTOR_DTYPES
from ..core.errors import BertforgeError
from ..core.io import atomic_write, check_output_file, check_text
from ..data.tables import table_format, table_records
from . import add_device_argument, add_precision_argument, add_quantize_argument, require_options

if TYPE_CHECKING:
    from ..pipelines.embed import EmbedPipeline
    from ..pipelines.embed_corpus import CorpusEmbedding

NAME = "embed"
HELP = ("embed the texts of a .txt (one a line), .jsonl, Parquet or Arrow file into a .npy array [n, hidden], or a "
        "corpus of any size into Parquet shards")
EXAMPLES = (
    'bertforge embed --model runs/my-embedder --input texts.txt --out vectors.npy',
    'bertforge embed --model runs/my-embedder --input corpus/ --out vectors/ --id-column doc_id   # shards',
    'bertforge embed --resume --out vectors/   # continue after the last complete shard',
)  # `--help` shows them; tests/test_cli.py parses them

log = logging.getLogger("bertforge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", metavar="DIR",
                        help="model directory (weights, config.json, tokenizer); required but with --resume")
    parser.add_argument("--input", metavar="PATH",
                        help=".txt: one text a line (row i of the output is line i); .jsonl: one JSON object a line; "
                             ".parquet, .arrow, .feather: one row a text (the pyarrow extra); with --out DIR also a "
                             "folder of them (sorted, recursively); required but with --resume")
    parser.add_argument("--out", required=True, metavar="FILE.npy|DIR",
                        help="a .npy name: one float32 array [n, hidden] in memory (small inputs); any other: a "
                             "directory of Parquet shards and manifest.json, the input streamed")
    parser.add_argument("--text-column", default=None, metavar="NAME",
                        help="JSON key (or Parquet/Arrow column) holding the text (text)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="default: what a sentence-transformers model declares, else mean")
    norm = parser.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None, help="unit-length embeddings")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false", help="raw pooled vectors")
    parser.add_argument("--layer", type=int, default=None, metavar="K",
                        help="pool the hidden states of layer K: 0 the embedding output, N the last of the model's "
                             "N layers, negative counts from the end (-1: the last, the default); layers above K "
                             "are not run")
    parser.add_argument("--max-length", type=int, default=None, metavar="N",
                        help="longest input in tokens; longer ones are truncated (default: the model's limit)")
    parser.add_argument("--max-batch-tokens", type=int, default=4096, metavar="N", help="real tokens per batch (4096)")
    prompts = parser.add_mutually_exclusive_group()
    prompts.add_argument("--prompt-name", default=None, metavar="NAME",
                         help="the model's sentence-transformers prompt put before every text (nomic-embed: "
                              "search_query, search_document; default: the model's default prompt, if any)")
    prompts.add_argument("--prompt", default=None, metavar="TEXT",
                         help="a prompt string put before every text instead ('' for none)")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="PyTorch threads (default: the CPUs available)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    add_quantize_argument(parser)
    add_precision_argument(parser)
    add_device_argument(parser)
    shards = parser.add_argument_group("shards (--out DIR)")
    shards.add_argument("--id-column", default=None, metavar="NAME",
                        help="the column (JSON key) whose values are the rows' ids (default: the row's position in "
                             "the input, from 0); a missing or repeated id is a bad row")
    shards.add_argument("--shard-rows", type=int, default=None, metavar="N",
                        help=f"input rows a shard (default {SHARD_ROWS:,}): memory holds about two "
                             f"shards' vectors")
    shards.add_argument("--vector-dtype", choices=VECTOR_DTYPES, default=None,
                        help="the stored vectors: float32 (the default), float16, or int8 with a float32 scale a row")
    shards.add_argument("--skip-bad-rows", action="store_true", default=None,
                        help="skip (and count in the manifest) rows with a missing or empty text or a missing or "
                             "repeated id, instead of stopping at the first")
    shards.add_argument("--sort-window", type=int, default=None, metavar="N",
                        help="rows tokenized and sorted by length together (default: the pipelines' 2048); larger "
                             "packs better")
    shards.add_argument("--resume", action="store_true",
                        help="continue the run in --out after its last complete shard, with its settings")
    shards.add_argument("--num-shards", type=int, default=1, metavar="K",
                        help="run as one of K processes (machines), each embedding every K-th shard (default 1)")
    shards.add_argument("--shard-index", type=int, default=0, metavar="I",
                        help="which of the --num-shards processes this is, 0..K-1 (default 0)")


SHARD_OPTIONS = ("id_column", "shard_rows", "vector_dtype", "skip_bad_rows", "resume")


def read_lines(path: Path) -> list[str]:
    """The file's lines as text (UTF-8, a BOM allowed), without line ends; a clear error for other encodings."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise BertforgeError(f"{path}: no such input file") from None
    except OSError as err:
        raise BertforgeError(f"{path}: cannot read ({err.strerror or err})") from None
    check_text(path, data)  # a binary file is refused by name
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BertforgeError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}, line {line}); "
            f"convert it first, e.g. `iconv -f latin1 -t utf-8`"
        ) from None
    text = io.StringIO(text, newline=None).read()  # \r\n and \r line ends become \n
    if not text:
        return []
    lines = text.split("\n")  # not splitlines(): that also splits at form feeds, U+2028, ...
    return lines[:-1] if text.endswith("\n") else lines


def read_texts(path: Path, text_column: str) -> list[str]:
    """Texts of a .txt file (every line, empty ones too), a .jsonl file (every non-blank line) or a Parquet or Arrow
    file (every row)."""
    suffix = path.suffix.lower()
    if table_format(path):
        return _column_texts(path, table_records(path), text_column)
    if suffix not in (".txt", ".jsonl"):
        raise BertforgeError(f"{path}: input must be a .txt (one text a line), .jsonl, Parquet or Arrow file")
    lines = read_lines(path)
    if suffix == ".txt":
        return lines
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertforgeError(f"{path}, line {number}: not valid JSON ({err.msg})") from None
        text = record.get(text_column) if isinstance(record, dict) else record
        if not isinstance(text, str):
            raise BertforgeError(f"{path}, line {number}: expected a JSON string or an object with a string {text_column!r}")
        texts.append(text)
    return texts


def _column_texts(path: Path, records: list[tuple[int, dict]], text_column: str) -> list[str]:
    texts = []
    for row, record in records:
        if not isinstance(record.get(text_column), str):
            problem = "no column" if text_column not in record else "not a string in column"
            raise BertforgeError(f"{path}, row {row}: {problem} {text_column!r} (--text-column names it)")
        texts.append(record[text_column])
    return texts


def run(args: argparse.Namespace) -> int:
    from ..core.system import reuse_freed_memory

    reuse_freed_memory()  # this process's allocator keeps freed memory: no page faults per large tensor
    if Path(args.out).suffix.lower() != ".npy":
        return run_shards(args)
    given = [f"--{name.replace('_', '-')}" for name in SHARD_OPTIONS if getattr(args, name)]
    given += ["--sort-window"] * (args.sort_window is not None) + ["--num-shards"] * (args.num_shards != 1)
    if given:
        raise BertforgeError(f"{', '.join(given)}: for shards in a directory (--out DIR); {args.out} is one .npy array")
    return run_array(args)


def corpus_settings(args: argparse.Namespace) -> "CorpusEmbedding":
    """The run's settings: those of the command line, or with --resume those the run in --out recorded, each one
    given here over it (a changed one is then refused by name)."""
    from ..pipelines.embed_corpus import CorpusEmbedding, recorded_settings

    fields = ("model", "input", "text_column", "id_column", "pooling", "normalize", "layer", "max_length",
              "prompt_name", "prompt", "quantize", "precision", "vector_dtype", "shard_rows", "skip_bad_rows")
    given = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.resume:
        settings = recorded_settings(args.out)
        return CorpusEmbedding(**{**dataclasses.asdict(settings), **given})
    require_options(given, ("model", "input"), " (--resume takes them from the run in --out)")
    return CorpusEmbedding(**given)


def run_shards(args: argparse.Namespace) -> int:
    import os

    from ..core.system import setup_runtime, teardown_runtime
    from ..pipelines.embed_corpus import Share, embed_corpus

    settings = corpus_settings(args)
    share = Share(args.shard_index, args.num_shards)
    runtime = None
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # under torchrun: each rank its part of the share
        runtime = setup_runtime(args.device or "cpu", threads=args.threads, training=False)
    try:
        summary = embed_corpus(settings, args.out, resume=args.resume, share=share,
                               max_batch_tokens=args.max_batch_tokens, sort_window=args.sort_window,
                               device=args.device, threads=args.threads, progress=args.progress, runtime=runtime)
    finally:
        if runtime is not None:
            teardown_runtime(runtime)
    skipped = sum(summary["skipped"].values())
    kept = f", {summary['kept']} complete before" if summary["kept"] else ""
    manifest = ("manifest.json written" if summary["manifest"]
                else "the manifest waits for the other processes' shards")
    if runtime is None or runtime.is_main:
        print(f"{summary['rows']} rows -> {args.out} ({summary['shards']} shard(s) written{kept}; {skipped} bad rows "
              f"skipped, {summary['truncated']} truncated; {manifest})", file=sys.stderr)
    return 0


def run_array(args: argparse.Namespace) -> int:
    from ..pipelines import pipeline

    require_options(vars(args), ("model", "input"))
    output = Path(args.out)
    if Path(args.input).is_dir():
        raise BertforgeError(f"--input {args.input} is a folder: embed it into shards, --out DIR")
    check_output_file(output, inputs=(args.input,), model=args.model)
    texts = read_texts(Path(args.input), args.text_column or "text")
    embed = cast("EmbedPipeline", pipeline(
        "embed", model=args.model, pooling=args.pooling, normalize=args.normalize,
        layer=-1 if args.layer is None else args.layer,
        max_length=args.max_length, max_batch_tokens=args.max_batch_tokens, num_threads=args.threads,
        progress=args.progress, quantize=args.quantize, device=args.device, prompt_name=args.prompt_name,
        prompt=args.prompt, precision=args.precision or "fp32"))
    vectors = embed(texts)  # [n, hidden]

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, vectors)

    atomic_write(output, write)
    print(f"{len(texts)} texts -> {output} ({vectors.shape[0]} x {vectors.shape[1]} float32, "
          f"{embed.pooling} pooling of layer {embed.layer}{', normalized' if embed.normalize else ''}"
          f"{', int8' if embed.quantize else ''})", file=sys.stderr)
    return 0
