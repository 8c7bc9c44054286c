"""Every command-line option is set by some test: walk every (sub)parser of `bertforge` and look for each option
string in the test files. A new option without a test fails here, named."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from bertforge.cli import build_parser

TESTS = Path(__file__).resolve().parent

# Options no test needs to set. Only argparse's own help: it prints the usage and exits, and adding an option
# never changes that. Nothing else belongs here: an option with no test gets one.
ALLOWED_UNTESTED = {"-h", "--help"}


def options(parser: argparse.ArgumentParser, command: str = "bertforge") -> list[tuple[str, str]]:
    """(command, option string) of every option of the parser and of its subcommands."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += options(sub, name)
        else:
            found += [(command, option) for option in action.option_strings]
    return found


def test_the_walk_finds_every_command():
    commands = {command for command, _ in options(build_parser())}
    assert commands == {"bertforge", "pretrain", "distill", "train-tokenizer", "finetune", "glue", "evaluate", "predict", "embed",
                        "train-embeddings", "mine-negatives", "fill-mask", "attention", "export-onnx", "serve"}


def test_every_option_is_set_by_some_test():
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py")) if p != Path(__file__).resolve())
    missing = sorted(
        f"{command} {option}"
        for command, option in set(options(build_parser()))
        if option not in ALLOWED_UNTESTED
        # the whole option: --text-pair-column does not count for --text-pair, nor --no-normalize for --normalize
        and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text)
    )
    assert not missing, f"options set by no test under tests/: {', '.join(missing)}"
