"""`bertforge pretrain`: train a BERT from raw text (MLM + NSP, or MLM alone with --no-nsp)."""

from __future__ import annotations

import argparse
import dataclasses

NAME = "pretrain"
HELP = "pretrain a BERT on your own corpus (with no arguments: a demo on the bundled corpus)"

# The no-argument demo: a tiny BERT on the bundled public-domain corpus in a few minutes on 2 CPU cores.
# Measured on 2 idle cores: 63 s in all; the MLM loss goes from ln(8000) = 8.99 to ~6.3 (11 % accuracy). 2,500 steps
# only reach 6.0 (4 min), so a longer demo buys little.
DEMO = dict(vocab_size=8000, max_steps=600, seq_len=64, lr=2e-3, warmup_steps=60, save_every=200, out="runs/demo")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..options import add_options
    from ..pretrain import PretrainArgs

    add_options(p, PretrainArgs, notes={name: f"demo {value}" for name, value in DEMO.items()})


def run(args: argparse.Namespace) -> int:
    """The settings given on the command line over the defaults (the demo's when no --corpus is given)."""
    from ..options import given
    from ..pretrain import PretrainArgs, pretrain

    base = PretrainArgs() if args.corpus else PretrainArgs(**DEMO)
    pretrain(dataclasses.replace(base, **given(args, PretrainArgs)))
    return 0
