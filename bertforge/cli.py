"""The `bertforge` command line. Subcommands live in `bertforge/commands/`, one module each.

Every failure a user can cause ends in one line on stderr naming the problem and a non-zero exit status;
`--debug` shows the traceback as well.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import traceback

from . import __version__
from .errors import BertforgeError

# In the order `--help` lists them.
COMMANDS = [
    "pretrain",
    "train_tokenizer",
    "finetune",
    "evaluate",
    "predict",
    "embed",
    "fill_mask",
    "attention",
    "export_onnx",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertforge",
        description="Pretrain, fine-tune and use BERT models. Run `bertforge COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as err:
            if err.name == f"{__package__}.commands.{name}":
                continue  # not built yet
            raise
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bertforge").setLevel(logging.INFO)
    try:
        return int(args.run(args) or 0)
    except BertforgeError as err:
        if args.debug:
            traceback.print_exc()
        print(f"bertforge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertforge {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # a bug in bertforge: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        print(
            f"bertforge {args.command}: internal error: {type(err).__name__}: {err} (rerun with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
