"""The `bertforge` command line. Subcommands live in `bertforge/commands/`, one module each.

Every failure a user can cause ends in one line on stderr naming the problem and a non-zero exit status;
`--debug` shows the traceback as well. Log lines go to stderr; `--quiet` keeps only warnings and errors there (and
turns progress bars off), `--log-file FILE` appends every line to FILE as well, timestamped (`-`: stdout), the
closing error line included. These options, like `--debug`, go before or after the command's name.
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


# Options of every command, before or after its name (`bertforge --quiet pretrain` or `bertforge pretrain --quiet`).
SHARED_OPTIONS: tuple[tuple[str, dict], ...] = (
    ("--debug", dict(action="store_true", help="show full tracebacks on errors")),
    ("--quiet", dict(action="store_true", help="only warnings and errors on stderr, no progress bars")),
    ("--log-file", dict(metavar="FILE", help="also append every log line to FILE, timestamped ('-': stdout)")),
)
FILE_FORMAT = "%(asctime)s %(levelname)s %(message)s"
_console: logging.Handler | None = None  # the stderr handler `configure_logging` set up, if it did


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="bertforge",
        description="Pretrain, fine-tune and use BERT models. Run `bertforge COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"bertforge {__version__}")
    for flag, spec in SHARED_OPTIONS:
        parser.add_argument(flag, **spec)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name}", __package__)  # a missing one is a bug: it fails
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP,
                           epilog="examples:\n" + "\n".join(f"  {line}" for line in module.EXAMPLES),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        for flag, spec in SHARED_OPTIONS:  # given here, it overrides the top level's
            p.add_argument(flag, **{**spec, "default": argparse.SUPPRESS})
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


def configure_logging(quiet: bool, log_file: str | None) -> logging.Handler | None:
    """Log lines (bertforge's at INFO) to stderr, warnings and errors only when `quiet`; with `log_file`, every line
    appended there too, timestamped ('-': stdout); under torchrun each rank but 0 writes FILE.rankN. Returns the
    file's handler (None without one)."""
    global _console
    root = logging.getLogger()
    if _console is None and not root.handlers:  # as basicConfig: a configured root (a host program's) stays as it is
        _console = logging.StreamHandler(sys.stderr)
        _console.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(_console)
        root.setLevel(logging.INFO)
    if _console is not None:
        _console.setLevel(logging.WARNING if quiet else logging.INFO)
    logging.getLogger("bertforge").setLevel(logging.INFO)
    if log_file is None:
        return None
    if log_file == "-":
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    else:
        rank = int(os.environ.get("RANK", "0"))
        handler = logging.FileHandler(log_file if rank == 0 else f"{log_file}.rank{rank}", mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    handler.setLevel(logging.INFO)
    root.addHandler(handler)
    return handler


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
    try:
        log_file = configure_logging(args.quiet, args.log_file)
    except OSError as err:
        print(f"bertforge {args.command}: error: --log-file {describe_os_error(err)}", file=sys.stderr)
        return 2
    if args.quiet and hasattr(args, "progress"):
        args.progress = False

    def fail(line: str, rc: int) -> int:
        print(f"bertforge {args.command}: {line}", file=sys.stderr)
        if log_file is not None:  # the log says how the run ended
            log_file.handle(logging.makeLogRecord({"msg": f"bertforge {args.command}: {line}", "levelno": logging.ERROR,
                                                   "levelname": "ERROR"}))
        return rc

    try:
        apply_switches(read_switches())  # BERTFORGE_LINEAR & co for every command, those that set up no runtime too
        rc = int(args.run(args) or 0)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            _end_torchrun_process(rc)
        return rc
    except BertforgeError as err:
        if args.debug:
            traceback.print_exc()
        return fail(f"error: {err}", 2)
    except KeyboardInterrupt as err:  # a training loop's stop (`training.loop.Interrupted`) says where it stopped
        return fail(str(err) or "interrupted", int(getattr(err, "exit_status", 130)))
    except OSError as err:  # the file system said no (read-only, full, permissions): one line naming the path
        if args.debug:
            traceback.print_exc()
        return fail(f"error: {describe_os_error(err)}", 2)
    except Exception as err:  # a bug in bertforge: still one line unless --debug
        if args.debug:
            traceback.print_exc()
        return fail(f"internal error: {type(err).__name__}: {err} (rerun with --debug for the traceback)", 1)
    finally:
        if log_file is not None:
            logging.getLogger().removeHandler(log_file)
            log_file.close()


if __name__ == "__main__":
    sys.exit(main())
