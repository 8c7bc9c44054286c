"""One module per CLI subcommand. Each defines `NAME`, `HELP`, `EXAMPLES` (command lines `--help` shows),
`add_arguments(parser)` and `run(args) -> int`.

The commands speak one vocabulary: the same option name for the same thing everywhere (`--model`, `--out`,
`--input`, `--max-length`, `--text-column`, `--keep-checkpoints`, `--early-stop-patience`, `--seed`, `--device`,
`--run-config`, ...), each trainer's settings declared once on its settings dataclass (`core.options`).
`tests/test_cli.py` fails on a second spelling of a shared setting and on an old one the changelog lists as removed.
Every trainer's `--seed` defaults to `constants.SEED`; every trainer records its settings in its run directory and
replays them with `--run-config` (`training/run_dir.py`). Each module's `EXAMPLES` end its `--help` and are parsed by
the tests. Every command calls `system.setup_runtime` before it works.

A new command is a module here and its name in `cli.COMMANDS`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..training.run_dir import RunKind


def add_quantize_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, what: str = "the model") -> None:
    """--quantize, the same for every command that runs a model for inference (see `bertforge.model.quantize`)."""
    from ..model.quantize import QUANTIZE_CHOICES

    parser.add_argument("--quantize", choices=QUANTIZE_CHOICES, default=None,
                        help=f"run {what} with int8 dense layers (CPU inference only; faster, slightly different "
                        "results); default: float32")


def add_device_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--device, the same for every command that runs a model for inference (`bertforge.core.system.inference_device`)."""
    from ..core.system import INFERENCE_DEVICES

    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help=f"where the model runs: {INFERENCE_DEVICES}; on CUDA in float16")


def add_precision_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--precision, the model's compute, for a command that runs a pipeline (`pipelines.base.INFERENCE_PRECISIONS`);
    how vectors are stored is another option (embed's --vector-dtype)."""
    from ..pipelines.base import INFERENCE_PRECISIONS

    parser.add_argument("--precision", choices=INFERENCE_PRECISIONS, default=None,
                        help="the model's compute: fp32 (the default on a CPU: transformers' numbers) or bf16 (a CPU's "
                             "bf16 units: faster, numbers within about 1e-2); on CUDA the model runs in float16")


def add_run_config_argument(parser: argparse.ArgumentParser, kind: RunKind) -> None:
    """--run-config, the same for every trainer: start from the settings a run recorded (`kind`: the trainer's
    `training.run_dir.RunKind`)."""
    resume = ("; --resume without it takes the settings of the run in --out" if kind.resume_option else "")
    parser.add_argument("--run-config", metavar="FILE",
                        help=f"repeat a run: its {kind.config_file} (or the run's directory); options given here "
                             f"override its settings{resume}")


def require_options(settings: dict, names: tuple[str, ...], hint: str = "") -> None:
    """Refuse, in one line, the settings among `names` that neither the command line nor a replayed run gave (a
    trainer's required options are not argparse-required: `--run-config` may give them)."""
    from ..core.errors import BertforgeError

    missing = [f"--{name.replace('_', '-')}" for name in names if not settings.get(name)]
    if missing:
        raise BertforgeError(f"missing required option(s): {', '.join(missing)}{hint}")
