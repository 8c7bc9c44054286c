"""`bertforge embed`: sentence embeddings of every line of a .txt file (or text of a .jsonl, Parquet or Arrow file)
into a .npy file."""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from ..core.constants import POOLINGS
from ..core.errors import BertforgeError
from ..core.io import atomic_write, check_output_file, check_text
from ..data.tables import table_format, table_records
from . import add_device_argument, add_quantize_argument

if TYPE_CHECKING:
    from ..pipelines.embed import EmbedPipeline

NAME = "embed"
HELP = "embed the texts of a .txt (one a line), .jsonl, Parquet or Arrow file into a .npy array [n, hidden]"
EXAMPLES = (
    'bertforge embed --model runs/my-embedder --input texts.txt --out vectors.npy',
)  # `--help` shows them; tests/test_cli.py parses them

log = logging.getLogger("bertforge")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory (weights, config.json, tokenizer)")
    parser.add_argument("--input", required=True, metavar="FILE",
                        help=".txt: one text a line (row i of the output is line i); .jsonl: one JSON object a line; "
                             ".parquet, .arrow, .feather: one row a text (the pyarrow extra)")
    parser.add_argument("--out", required=True, metavar="FILE", help="the embeddings, a float32 .npy file [n, hidden]")
    parser.add_argument("--text-column", default="text", metavar="NAME", help="JSON key (or Parquet/Arrow column) holding the text (text)")
    parser.add_argument("--pooling", choices=POOLINGS, default=None,
                        help="default: what a sentence-transformers model declares, else mean")
    norm = parser.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=None, help="unit-length embeddings")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false", help="raw pooled vectors")
    parser.add_argument("--layer", type=int, default=-1, metavar="K",
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
    add_device_argument(parser)


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
    from ..pipelines import pipeline
    from ..core.system import reuse_freed_memory

    reuse_freed_memory()  # this process's allocator keeps freed memory: no page faults per large tensor
    output = Path(args.out)
    if output.suffix != ".npy":
        raise BertforgeError(f"{output}: the output file name must end in .npy")
    check_output_file(output, inputs=(args.input,), model=args.model)
    texts = read_texts(Path(args.input), args.text_column)
    embed = cast("EmbedPipeline", pipeline(
        "embed", model=args.model, pooling=args.pooling, normalize=args.normalize, layer=args.layer,
        max_length=args.max_length, max_batch_tokens=args.max_batch_tokens, num_threads=args.threads,
        progress=args.progress, quantize=args.quantize, device=args.device, prompt_name=args.prompt_name,
        prompt=args.prompt))
    vectors = embed(texts)  # [n, hidden]

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.save(fh, vectors)

    atomic_write(output, write)
    print(f"{len(texts)} texts -> {output} ({vectors.shape[0]} x {vectors.shape[1]} float32, "
          f"{embed.pooling} pooling of layer {embed.layer}{', normalized' if embed.normalize else ''}"
          f"{', int8' if embed.quantize else ''})", file=sys.stderr)
    return 0
