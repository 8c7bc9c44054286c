"""`bertforge glue`: fine-tune and score a model on every GLUE task found in a directory; print the GLUE table."""

from __future__ import annotations

import argparse

NAME = "glue"
HELP = "fine-tune and score a model on each GLUE task of a directory (dev splits); prints and saves the GLUE table"

# FinetuneConfig fields that `bertforge glue` passes to every task's fine-tuning
FINETUNE_OPTIONS = ("epochs", "batch_size", "lr", "warmup_ratio", "weight_decay", "seed", "grad_accum", "max_length",
                    "eval_batch_size", "lenient_rows", "device", "progress", "overwrite")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..finetune import FinetuneConfig
    from ..finetune.glue import GlueOptions
    from ..core.options import add_options

    add_options(parser, FinetuneConfig, only=("model",), required=("model",))
    add_options(parser, GlueOptions, required=("data_dir",))
    add_options(parser.add_argument_group("fine-tuning (the same for every task)"), FinetuneConfig,
                only=FINETUNE_OPTIONS)


def run(args: argparse.Namespace) -> int:
    from ..finetune import FinetuneConfig
    from ..finetune.glue import GlueOptions, glue
    from ..core.options import given

    from ..core.system import last_runtime

    report = glue(args.model, **given(args, GlueOptions), **given(args, FinetuneConfig, only=FINETUNE_OPTIONS))
    rt = last_runtime()
    if rt is not None and not rt.is_main:  # under torchrun, rank 0 speaks for the run
        return 0
    print(report["table"], end="")
    for name, reason in report["skipped"].items():
        print(f"{name} skipped: {reason}")
    return 0
