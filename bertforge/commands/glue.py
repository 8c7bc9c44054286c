"""`bertforge glue`: fine-tune and score a model on every GLUE task found in a directory; print the GLUE table."""

from __future__ import annotations

import argparse

from . import add_run_config_argument, require_options
from ..training.adapters import LORA_OPTIONS

NAME = "glue"
HELP = "fine-tune and score a model on each GLUE task of a directory (dev splits); prints and saves the GLUE table"
EXAMPLES = (
    'bertforge glue --model runs/my-bert/model --data-dir glue_data/ --tasks SST-2 MRPC --out runs/glue',
    'bertforge glue --resume --out runs/glue            # continue a run that stopped, with its recorded settings',
)  # `--help` shows them; tests/test_cli.py parses them

# FinetuneConfig fields that `bertforge glue` passes to every task's fine-tuning
FINETUNE_OPTIONS = ("epochs", "batch_size", "lr", "warmup_ratio", "weight_decay", "seed", "grad_accum", "max_length",
                    "eval_batch_size", "lenient_rows", "device", "progress", "overwrite", "resume", "save_every",
                    *LORA_OPTIONS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..finetune import FinetuneConfig
    from ..finetune.glue import GLUE_RUN, GlueOptions
    from ..core.options import add_options

    add_run_config_argument(parser, GLUE_RUN)
    add_options(parser, FinetuneConfig, only=("model",))
    add_options(parser, GlueOptions)
    add_options(parser.add_argument_group("fine-tuning (the same for every task)"), FinetuneConfig,
                only=FINETUNE_OPTIONS)


def run(args: argparse.Namespace) -> int:
    from ..core.options import given
    from ..core.system import last_runtime
    from ..finetune import FinetuneConfig
    from ..finetune.glue import GLUE_RUN, GlueOptions, glue
    from ..training.run_dir import recorded_settings, settings_to_replay

    replay = settings_to_replay(args.run_config, args.resume, args.out, GLUE_RUN)
    settings = recorded_glue_run(recorded_settings(replay, GLUE_RUN)) if replay else {}
    settings.update({**given(args, FinetuneConfig, only=("model", *FINETUNE_OPTIONS)), **given(args, GlueOptions)})
    hint = (f" (--resume found no {GLUE_RUN.config_file} in {args.out} to take them from)"
            if args.resume and args.out else "")
    require_options(settings, ("model", "data_dir"), hint)
    report = glue(**settings)
    rt = last_runtime()
    if rt is not None and not rt.is_main:  # under torchrun, rank 0 speaks for the run
        return 0
    print(report["table"], end="")
    for name, reason in report["skipped"].items():
        print(f"{name} skipped: {reason}")
    return 0


def recorded_glue_run(recorded: dict) -> dict:
    """The settings a GLUE run recorded in its glue_config.json, as `glue`'s keywords: its own, the model, and the
    fine-tuning settings it gives every task."""
    from ..training.run_dir import INVOCATION_ONLY

    finetuning = recorded.pop("finetune", None) or {}
    return {**{k: v for k, v in finetuning.items() if k in FINETUNE_OPTIONS and k not in INVOCATION_ONLY}, **recorded}
