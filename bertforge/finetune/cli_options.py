"""Command-line options shared by `bertforge finetune`, `evaluate` and `predict`, generated from the fields of
`DataOptions` and `FinetuneConfig` (see `bertforge.core.options`).

Every option defaults to None, meaning "not given": the command then keeps the value from `--config` (finetune)
or the `DataOptions` / `FinetuneConfig` default, so the defaults live in one place.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..core.options import add_options, cli_fields
from .config import DataOptions, FinetuneConfig


def add_task_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """--task and --model."""
    add_options(parser, FinetuneConfig, only=("task", "model"), required=("task", "model") if required else ())


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `DataOptions`: how files are read and encoded, and where the model runs."""
    add_options(parser.add_argument_group("data"), DataOptions)


DATA_OPTIONS = tuple(f.name for f in cli_fields(DataOptions))


def given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    """The options among `names` that were given on the command line."""
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
