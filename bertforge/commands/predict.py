"""`bertforge predict`: run a fine-tuned model over new inputs and write one JSON prediction a line."""

from __future__ import annotations

import argparse
import sys

from ..finetune.cli_options import DATA_OPTIONS, add_data_arguments, add_task_arguments, given
from . import add_quantize_argument

NAME = "predict"
HELP = "predict with a fine-tuned model; writes JSONL (one prediction per input)"
EXAMPLES = (
    'bertforge predict --task classification --model runs/sst2/model --input new.csv --out predictions.jsonl',
)  # `--help` shows them; tests/test_cli.py parses them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_arguments(parser)
    parser.add_argument("--input", required=True, metavar="FILE",
                        help="inputs: CSV/TSV/JSONL (classification), CoNLL or JSONL with tokens/text (ner), "
                        "SQuAD JSON or JSONL with question/context (qa)")
    parser.add_argument("--out", required=True, metavar="FILE", help="predictions, JSONL")
    add_data_arguments(parser)
    add_quantize_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..finetune import predict
    from ..core.system import reuse_freed_memory

    reuse_freed_memory()  # this process's allocator keeps freed memory: no page faults per large tensor
    records = predict(args.task, args.model, args.input, args.out, quantize=args.quantize,
                      **given(args, DATA_OPTIONS))
    print(f"wrote {len(records)} prediction(s) to {args.out}", file=sys.stderr)
    return 0
