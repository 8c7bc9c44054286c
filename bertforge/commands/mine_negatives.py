"""`bertforge mine-negatives`: add hard negatives to (anchor, positive) pairs, ranked by an embedding model (and
optionally rescored by a cross-encoder), as sentence-transformers' `mine_hard_negatives` picks them; writes
triplets or n-tuples that `train-embeddings` reads (`bertforge.evaluation.negatives`)."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from ..core.constants import SEED
from ..core.errors import BertforgeError
from . import add_device_argument, add_quantize_argument

NAME = "mine-negatives"
HELP = "add hard negatives to (anchor, positive) pairs, ranked by an embedding model: triplets or n-tuples"
EXAMPLES = (
    'bertforge mine-negatives --model all-MiniLM-L6-v2 --input pairs.csv --out triplets.jsonl',
    'bertforge mine-negatives --model all-MiniLM-L6-v2 --input pairs.jsonl --out rows.csv --format n-tuple '
    '--num-negatives 5 --range-min 10 --range-max 50 --relative-margin 0.05 --sampling random',
    'bertforge mine-negatives --model all-MiniLM-L6-v2 --input pairs.tsv --corpus docs.txt --reranker '
    'ms-marco-MiniLM-L6-v2 --max-score 0.9 --out triplets.tsv',
)  # `--help` shows them; tests/test_cli.py parses them
OUTPUT_SUFFIXES = (".jsonl", ".csv", ".tsv")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..evaluation.negatives import OUTPUT_FORMATS, SAMPLINGS

    parser.add_argument("--model", required=True, metavar="DIR", help="the embedding model that ranks the corpus")
    parser.add_argument("--input", required=True, metavar="FILE",
                        help="(anchor, positive) pairs: CSV, TSV, JSONL, Parquet or Arrow, read as train-embeddings "
                             "reads them (the first two texts of each row)")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the mined rows: .jsonl, .csv or .tsv (columns anchor, positive, negative or "
                             "negative_1..N)")
    parser.add_argument("--corpus", metavar="FILE", help="the candidate documents (.txt one a line, .jsonl, Parquet, "
                        "Arrow; with the positives added); default: the positives")
    parser.add_argument("--text-column", default="text", metavar="NAME",
                        help="--corpus .jsonl/Parquet/Arrow: the column holding the text (text)")
    group = parser.add_argument_group("which negatives")
    group.add_argument("--num-negatives", type=int, default=3, metavar="N", help="negatives per pair (3)")
    group.add_argument("--range-min", type=int, default=0, metavar="K",
                       help="skip the first K candidates of each ranking (0)")
    group.add_argument("--range-max", type=int, default=None, metavar="K",
                       help="consider candidates up to rank K (default: range-min + num-negatives (x10 with a "
                            "filter) + the most positives of an anchor)")
    group.add_argument("--margin", type=float, default=None, metavar="M",
                       help="drop candidates scoring above the positive's score minus M")
    group.add_argument("--relative-margin", type=float, default=None, metavar="R",
                       help="drop candidates scoring above positive - |positive| x R (0.05: 5%% below it)")
    group.add_argument("--max-score", type=float, default=None, metavar="S", help="drop candidates scoring above S")
    group.add_argument("--min-score", type=float, default=None, metavar="S", help="drop candidates scoring below S")
    group.add_argument("--sampling", choices=SAMPLINGS, default="top",
                       help="top: the best candidates of the window; random: a sample of them (top)")
    group.add_argument("--format", choices=OUTPUT_FORMATS, default="triplet",
                       help="triplet: a row per negative; n-tuple: a row per pair with all its negatives (pairs "
                            "short of N are dropped) (triplet)")
    group.add_argument("--reranker", metavar="DIR", help="rescore the candidates and positives with this "
                       "cross-encoder before filtering and choosing")
    group.add_argument("--seed", type=int, default=SEED, metavar="N", help=f"random sampling's seed ({SEED})")
    run_group = parser.add_argument_group("running the models")
    run_group.add_argument("--max-length", type=int, default=None, metavar="N",
                           help="longest input in tokens (default: the model's)")
    run_group.add_argument("--max-batch-tokens", type=int, default=4096, metavar="N", help="real tokens per batch (4096)")
    run_group.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bar")
    add_quantize_argument(run_group, "the models")
    add_device_argument(run_group)


def read_pairs(path: str) -> tuple[list[str], list[str]]:
    """The anchors and positives of a pair (or triplet) file."""
    from ..embeddings_train.data import read_pairs as read

    data = read(path)
    if data.shape == "scored":
        raise BertforgeError(f"{path}: scored pairs (a score column); mine-negatives reads (anchor, positive) pairs")
    return data.texts[0], data.texts[1]


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    """The rows as JSONL, CSV or TSV (by the suffix), written atomically."""
    from ..core.io import atomic_write_text, json_line

    if path.suffix.lower() == ".jsonl":
        atomic_write_text(path, "".join(json_line(row) for row in rows))
        return
    text = io.StringIO()
    writer = csv.writer(text, delimiter="\t" if path.suffix.lower() == ".tsv" else ",", lineterminator="\n")
    writer.writerow(list(rows[0]))
    writer.writerows(list(row.values()) for row in rows)
    atomic_write_text(path, text.getvalue())


def run(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from ..core.io import check_output_file
    from ..core.system import reuse_freed_memory
    from ..evaluation.negatives import MiningSettings, mine_negatives
    from ..pipelines.embed import EmbedPipeline
    from ..pipelines.rerank import RerankPipeline
    from .embed import read_texts
    from .evaluate import query_and_document_encoders

    out = Path(args.out)
    if out.suffix.lower() not in OUTPUT_SUFFIXES:
        raise BertforgeError(f"{out}: the output must end in {', '.join(OUTPUT_SUFFIXES)}")
    check_output_file(out, inputs=(args.input, args.corpus), model=args.model)
    if args.reranker is not None:
        check_output_file(out, model=args.reranker)
    settings = MiningSettings(range_min=args.range_min, range_max=args.range_max, margin=args.margin,
                              relative_margin=args.relative_margin, max_score=args.max_score, min_score=args.min_score,
                              num_negatives=args.num_negatives, sampling=args.sampling, output_format=args.format,
                              seed=args.seed)
    settings.window(1, args.reranker is not None)  # a bad window is refused before any model is loaded
    reuse_freed_memory()
    pipeline = {"max_length": args.max_length, "max_batch_tokens": args.max_batch_tokens, "progress": args.progress,
                "quantize": args.quantize, "device": args.device}
    embed = EmbedPipeline(args.model, normalize=True, **pipeline)  # unit length, as sentence-transformers mines
    queries, documents = query_and_document_encoders(embed)
    rerank = None if args.reranker is None else RerankPipeline(args.reranker, **pipeline).score
    anchors, positives = read_pairs(args.input)
    corpus = None
    if args.corpus is not None:
        corpus = [t for t in read_texts(Path(args.corpus), args.text_column) if t.strip()]
        if not corpus:
            raise BertforgeError(f"{args.corpus}: no texts")
    rows = mine_negatives(anchors, positives, queries,
                          lambda texts: torch.from_numpy(np.stack(list(documents(texts)))),
                          settings, corpus=corpus, similarity=embed.similarity, rerank=rerank)
    if not rows:
        raise BertforgeError("no pair found a negative: widen --range-max or loosen --margin, --relative-margin, "
                             "--max-score, --min-score" + (" (n-tuples need all --num-negatives)"
                                                           if args.format == "n-tuple" else ""))
    write_rows(out, rows)
    pairs = len(anchors)
    print(f"{pairs} pairs -> {len(rows)} {args.format} rows -> {out}", file=sys.stderr)
    return 0
