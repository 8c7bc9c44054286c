"""`bertforge finetune`: fine-tune a pretrained model for classification, NER or extractive QA."""

from __future__ import annotations

import argparse
import json

from ..errors import BertforgeError
from ..finetune.cli_options import DATA_OPTIONS, add_data_arguments, add_task_arguments, given

NAME = "finetune"
HELP = "fine-tune a pretrained model: sentence(-pair) classification or regression, NER, extractive QA"

TRAINING_OPTIONS = (
    "task", "model", "train", "dev", "out", "epochs", "batch_size", "lr", "warmup_ratio", "weight_decay", "seed",
    "grad_accum", "eval_every", "early_stop", "metric", "group_by_length", "log_every", "overwrite", "max_skipped_steps",
)
REQUIRED = ("task", "model", "train", "dev", "out")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="start from a run's finetune_config.json (repeats it); options given here override it")
    add_task_arguments(parser, required=False)
    parser.add_argument("--train", metavar="FILE", help="training data (CSV/TSV/JSONL, CoNLL, or SQuAD JSON)")
    parser.add_argument("--dev", metavar="FILE", help="dev data, scored at each evaluation")
    parser.add_argument("--out", metavar="DIR", help="output directory: model/, eval.json, metrics.jsonl, ...")
    parser.add_argument("--overwrite", action="store_true", default=None, help="replace an --out holding an earlier run")
    group = parser.add_argument_group("training")
    group.add_argument("--epochs", type=int, metavar="N", help="passes over the training data (3)")
    group.add_argument("--batch-size", type=int, metavar="N", help="examples per batch (32)")
    group.add_argument("--lr", type=float, metavar="LR", help="peak learning rate (5e-5)")
    group.add_argument("--warmup-ratio", type=float, metavar="R", help="fraction of steps warming up (0.1)")
    group.add_argument("--weight-decay", type=float, metavar="W", help="AdamW weight decay (0.01)")
    group.add_argument("--seed", type=int, metavar="N", help="random seed (42)")
    group.add_argument("--grad-accum", type=int, metavar="N", help="batches per optimizer step (1)")
    group.add_argument("--eval-every", type=int, metavar="N", help="also evaluate every N optimizer steps")
    group.add_argument("--early-stop", type=int, metavar="N", help="stop after N evaluations without improvement")
    group.add_argument("--metric", help="main metric that picks the best checkpoint "
                       "(default: accuracy; pearson for regression; f1 for ner and qa)")
    group.add_argument("--no-group-by-length", dest="group_by_length", action="store_false", default=None,
                       help="plain shuffled batches instead of batches of similar length")
    group.add_argument("--log-every", type=int, metavar="N", help="training-loss record every N steps (10)")
    group.add_argument("--max-skipped-steps", type=int, metavar="N",
                       help="stop with an error after N steps in a row with a non-finite loss or gradient (10)")
    add_data_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..finetune import FinetuneConfig, finetune

    settings = {}
    if args.config:
        settings = FinetuneConfig.from_json(args.config).to_dict()
    settings.update(given(args, TRAINING_OPTIONS + DATA_OPTIONS))
    missing = [f"--{name}" for name in REQUIRED if not settings.get(name)]
    if missing:
        raise BertforgeError(f"missing required option(s): {', '.join(missing)}")
    summary = finetune(FinetuneConfig.from_dict(settings, args.config or "options"))
    print(json.dumps(summary, indent=2))
    return 0
