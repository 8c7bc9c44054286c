"""`bertforge distill`: a DistilBERT student trained from a teacher checkpoint on your corpus."""

from __future__ import annotations

import argparse
import dataclasses

NAME = "distill"
HELP = "distil a BERT or RoBERTa checkpoint into a DistilBERT (half the layers) on a corpus"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..pretrain.distill import TEACHER_DECIDES, DistillArgs
    from ..core.options import add_options, cli_fields

    add_options(p, DistillArgs, only=[f.name for f in cli_fields(DistillArgs) if f.name not in TEACHER_DECIDES],
                required=("teacher", "corpus"))


def run(args: argparse.Namespace) -> int:
    from ..pretrain.distill import DistillArgs, distill
    from ..core.options import given

    settings = given(args, DistillArgs)
    distill(dataclasses.replace(DistillArgs(teacher=settings["teacher"]), **settings))
    return 0
