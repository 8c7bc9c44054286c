"""The `bertforge` command line. Subcommands live in `bertforge/commands/`, one module each.

Every failure a user can cause ends in one line on stderr naming the problem and a non-zero exit status;
`--debug` shows the traceback as well.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback
from typing import NoReturn

from . import __version__
from .core.errors import BertforgeError
from .core.system import apply_switches, read_switches

# In the order `--help` lists them.
COMMANDS = [
    "pretrain",
    "distill",
    "train_tokenizer",
    "finetune",
    "glue",
    "train_embeddings",
    "evaluate",
    "mine_negatives",
    "predict",
    "embed",
    "fill_mask",
    "attention",
    "export_onnx",
    "serve",
]


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse prints a usage block before its error; bertforge prints one line naming the problem. Options are
    taken as spelt only (no abbreviations: a prefix such as a removed option's name is refused, not read as the
    longer option it begins)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # argparse messages can hold newlines
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="bertforge",
        description="Pretrain, fine-tune and use BERT models. Run `bertforge COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name}", __package__)  # a missing one is a bug: it fails
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP,
                           epilog="examples:\n" + "\n".join(f"  {line}" for line in module.EXAMPLES),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")
        module.add_arguments(p)
        p.set_defaults(run=module.run)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each command of `parser` (`build_parser()`'s), by name, in `--help` order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    return subcommands(parser).get(command or "", parser)


def describe_os_error(err: OSError) -> str:
    """'PATH: cause' (both paths of a rename) for an OSError, in one line; the cause alone when it names no path."""
    cause = err.strerror or str(err) or type(err).__name__
    paths = [str(p) for p in (err.filename, err.filename2) if p is not None]
    if paths:
        return f"{' -> '.join(paths)}: {cause}"
    return f"{cause} ({type(err).__name__})"


def _end_torchrun_process(rc: int) -> None:
    """End a process of a torchrun job whose command finished: flush, then exit without the interpreter's teardown.
    After a run that succeeded (process group destroyed, files closed), gloo's threads still made the normal exit
    abort now and then ("terminate called without an active exception", SIGABRT: 1 torchrun test in about 20
    here), and torchrun then reports the whole job as failed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except Exception as err:  # a broken subcommand module: a bug, but still one line unless --debug
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            traceback.print_exc()
        print(f"bertforge: internal error: {type(err).__name__}: {err} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would blame the top-level parser; name the subcommand whose options these are not
        _subparser(parser, getattr(args, "command", None)).error(f"unrecognized arguments: {' '.join(unknown)}")
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bertforge").setLevel(logging.INFO)
    try:
        apply_switches(read_switches())  # BERTFORGE_LINEAR & co for every command, those that set up no runtime too
        rc = int(args.run(args) or 0)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _end_torchrun_process(rc)
        return rc
    except BertforgeError as err:
        if args.debug:
            traceback.print_exc()
        print(f"bertforge {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bertforge {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # the file system said no (read-only, full, permissions): one line naming the path
        if args.debug:
            traceback.print_exc()
        print(f"bertforge {args.command}: error: {describe_os_error(err)}", file=sys.stderr)
        return 2
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
