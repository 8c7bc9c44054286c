"""One module per CLI subcommand. Each defines `NAME`, `HELP`, `add_arguments(parser)` and `run(args) -> int`."""

from __future__ import annotations

import argparse


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
