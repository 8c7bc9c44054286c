"""`bertforge evaluate`: score a fine-tuned model on a labelled file and print the metrics as JSON."""

from __future__ import annotations

import argparse
import json

from ..finetune.cli_options import DATA_OPTIONS, add_data_arguments, add_task_arguments, given
from . import add_quantize_argument

NAME = "evaluate"
HELP = "score a fine-tuned model on labelled data; prints the metrics as JSON"
EXAMPLES = (
    'bertforge evaluate --task classification --model runs/sst2/model --input test.csv',
)  # `--help` shows them; tests/test_cli.py parses them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_task_arguments(parser)
    parser.add_argument("--input", required=True, metavar="FILE", help="labelled data in the task's format")
    add_data_arguments(parser)
    add_quantize_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..finetune import evaluate
    from ..core.system import reuse_freed_memory

    reuse_freed_memory()  # this process's allocator keeps freed memory: no page faults per large tensor
    metrics = evaluate(args.task, args.model, args.input, quantize=args.quantize, **given(args, DATA_OPTIONS))
    print(json.dumps(metrics, indent=2))
    return 0
