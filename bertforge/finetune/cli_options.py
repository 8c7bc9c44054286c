"""Command-line options shared by `bertforge finetune`, `evaluate` and `predict`.

Every option defaults to None, meaning "not given": the command then keeps the value from `--config` (finetune)
or the `DataOptions` / `FinetuneConfig` default, so the defaults live in one place.
"""

from __future__ import annotations

import argparse
from typing import Any

from .config import FINETUNE_TASKS


def add_task_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--task", choices=FINETUNE_TASKS, required=required, help="the task: classification, ner or qa")
    parser.add_argument("--model", required=required, metavar="DIR", help="model directory (weights, config.json, tokenizer)")


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `DataOptions`: how files are read and encoded, and where the model runs."""
    group = parser.add_argument_group("data")
    group.add_argument("--max-length", type=int, metavar="N", help="tokens per input (default 128; 384 for qa)")
    group.add_argument("--text-column", metavar="NAME", help="classification: text column or JSON key; "
                       "a 0-based index with --no-header (default: text, sentence or sentence1)")
    group.add_argument("--text-pair-column", metavar="NAME", help="classification: second text of a sentence pair")
    group.add_argument("--label-column", metavar="NAME", help="classification: label column (default: label)")
    group.add_argument("--no-header", action="store_true", default=None,
                       help="CSV/TSV without a header row; columns are then 0-based indices")
    group.add_argument("--lenient-rows", action="store_true", default=None,
                       help="CSV/TSV: skip rows with more or fewer fields than the header, or broken quotes, with a "
                       "warning counting them (default: such a row is an error naming its line)")
    group.add_argument("--doc-stride", type=int, metavar="N", help="qa: tokens shared by consecutive context windows (128)")
    group.add_argument("--max-query-length", type=int, metavar="N", help="qa: longest question in tokens (64)")
    group.add_argument("--max-answer-length", type=int, metavar="N", help="qa: longest answer in tokens (30)")
    group.add_argument("--n-best", type=int, metavar="N", help="qa: start/end candidates per window (20)")
    group.add_argument("--eval-batch-size", type=int, metavar="N", help="batch size for evaluation/prediction (64)")
    group.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda when available)")
    group.add_argument("--no-progress", dest="progress", action="store_false", default=None, help="no progress bars")


DATA_OPTIONS = (
    "max_length", "text_column", "text_pair_column", "label_column", "no_header", "lenient_rows", "doc_stride",
    "max_query_length",
    "max_answer_length", "n_best", "eval_batch_size", "device", "progress",
)


def given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The options among `names` that were given on the command line."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
