"""`bertforge finetune`: fine-tune a pretrained model for classification, NER, extractive QA, reranking or multiple
choice."""

from __future__ import annotations

import argparse
import json

from . import add_run_config_argument, require_options
from ..finetune.cli_options import DATA_OPTIONS, add_data_arguments, add_task_arguments, given

NAME = "finetune"
HELP = "fine-tune a pretrained model: sentence(-pair) classification or regression, NER, extractive QA, multiple choice"
EXAMPLES = (
    'bertforge finetune --task classification --model runs/my-bert/model --train train.csv --dev dev.csv --out runs/sst2',
    'bertforge finetune --run-config runs/sst2/finetune_config.json --seed 7 --out runs/sst2-seed7   # the same run, another seed',
)  # `--help` shows them; tests/test_cli.py parses them

TOP_LEVEL = ("train", "dev", "out", "resume", "overwrite")
REQUIRED = ("task", "model", "train", "dev", "out")


def training_options() -> tuple[str, ...]:
    """FinetuneConfig's own options, beside those of DataOptions."""
    from ..finetune import FinetuneConfig
    from ..core.options import cli_fields

    return tuple(f.name for f in cli_fields(FinetuneConfig) if f.name not in DATA_OPTIONS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..finetune import FinetuneConfig
    from ..finetune.api import FINETUNING
    from ..core.options import add_options

    add_run_config_argument(parser, FINETUNING)
    add_task_arguments(parser, required=False)
    add_options(parser, FinetuneConfig, only=TOP_LEVEL)
    rest = [name for name in training_options() if name not in TOP_LEVEL + ("task", "model")]
    add_options(parser.add_argument_group("training"), FinetuneConfig, only=rest)
    add_data_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..finetune import FinetuneConfig, finetune
    from ..finetune.api import FINETUNING, RUN_MARKER
    from ..core.system import last_runtime
    from ..training.run_dir import settings_to_replay

    source = settings_to_replay(args.run_config, args.resume, args.out, FINETUNING)
    settings = FinetuneConfig.from_json(source).to_dict() if source else {}
    settings.update(given(args, training_options() + DATA_OPTIONS))
    hint = f" (--resume found no {RUN_MARKER} in {args.out} to take them from)" if args.resume and args.out else ""
    require_options(settings, REQUIRED, hint)
    summary = finetune(FinetuneConfig.from_dict(settings, source or "options"))
    rt = last_runtime()  # the one the run set up
    if rt is None or rt.is_main:  # under torchrun, rank 0 speaks for the run
        print(json.dumps(summary, indent=2))
    return 0
