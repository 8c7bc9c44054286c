"""`bertforge distill`: a student of half the teacher's layers (a DistilBERT from a BERT-shaped teacher, a DeBERTa or
ModernBERT from one of those) trained from a teacher checkpoint on your corpus."""

from __future__ import annotations

import argparse

from . import add_run_config_argument

NAME = "distill"
HELP = ("distil a checkpoint into a student of half its layers on a corpus: BERT / RoBERTa into a DistilBERT, "
        "DeBERTa and ModernBERT into their own family")
EXAMPLES = (
    'bertforge distill --teacher runs/my-bert/model --corpus my_corpus/ --max-steps 5000 --out runs/my-distilbert',
)  # `--help` shows them; tests/test_cli.py parses them


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..pretrain.args import PRETRAINING
    from ..pretrain.distill import TEACHER_DECIDES, DistillArgs
    from ..core.options import add_options, cli_fields

    add_run_config_argument(p, PRETRAINING)
    add_options(p, DistillArgs, only=[f.name for f in cli_fields(DistillArgs) if f.name not in TEACHER_DECIDES])


def run(args: argparse.Namespace) -> int:
    from ..core.options import given
    from ..pretrain.args import with_recorded_run
    from ..pretrain.distill import DistillArgs, distill

    settings = with_recorded_run(given(args, DistillArgs), args.run_config, DistillArgs)
    distill(DistillArgs(**settings))  # it refuses a missing --teacher or --corpus by name
    return 0
