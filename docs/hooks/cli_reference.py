"""Generates the command-line reference (`reference/cli.md`) from the parsers the `bertforge` command builds.

`bertforge.cli.build_parser()` assembles every subcommand from `bertforge/commands/` (whose options come from the
settings dataclasses' `option` fields and the commands' own `add_argument` calls), so the page lists exactly the
options the command line accepts, with their help, defaults and choices: it cannot drift from the code.

MkDocs runs `on_files` as a hook (`mkdocs.yml`: `hooks:`); `render()` is what it writes, and what
`tests/test_docs.py` checks against the parser.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from bertforge.cli import SHARED_OPTIONS

PAGE = "reference/cli.md"

INTRO = """# Command-line reference

Every `bertforge` command and option, generated from the parsers the command line builds (`bertforge/cli.py`, one
module per command in `bertforge/commands/`; most options are fields of a settings dataclass declared once with
`bertforge.core.options.option`, whose default the help text states). `bertforge COMMAND --help` prints the same
text. An option with no *default* here is off, or takes the value its help describes.

Every command also accepts, before or after its name, `--debug` (full tracebacks on errors), `--quiet` (only
warnings and errors on stderr, no progress bars) and `--log-file FILE` (every log line appended to FILE as well,
timestamped, the closing error line included; `-`: stdout). Log lines go to stderr; a command's results go to
stdout or to its `--out`. Failures a user can cause end in one line on stderr naming the problem, with exit status
2; an interruption exits with 130 (SIGINT) or 143 (SIGTERM), a training run after its checkpoint.
"""


SHARED = {flag.lstrip("-").replace("-", "_") for flag, _ in SHARED_OPTIONS}


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _flags(action: argparse.Action) -> str:
    names = ", ".join(f"`{flag}`" for flag in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if action.nargs == "+":
        metavar = f"{metavar} [{metavar} ...]"
    elif action.nargs == "*":
        metavar = f"[{metavar} ...]"
    elif action.nargs == "?":
        metavar = f"[{metavar}]"
    return f"{names} `{metavar}`" if action.option_strings else f"`{metavar}`"


STATED_DEFAULT = re.compile(r" ?\(default:? ([^()]*)\)")


def _default(action: argparse.Action) -> tuple[str, str]:
    """(the default, the help without the "(default X)" that states it). A settings field's option has the parser
    default None (meaning "not given") and states the field's default in its help; a plain option has its own."""
    text = _cell(action.help or "")
    stated = STATED_DEFAULT.search(text)
    if stated:
        value = stated.group(1)
        return (value if " " in value else f"`{value}`"), (text[: stated.start()] + text[stated.end():]).strip()
    if action.default in (None, argparse.SUPPRESS, False) or action.nargs == 0:
        return "", text
    return f"`{action.default}`", text


def _rows(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """The parser's argument groups in `--help` order, without help and the options every command shares
    (`cli.SHARED_OPTIONS`)."""
    groups = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.dest not in SHARED]
        if actions:
            groups.append((group.title or "options", actions))
    return groups


def render_command(name: str, parser: argparse.ArgumentParser) -> str:
    lines = [f"## `bertforge {name}`", "", _cell(parser.description or ""), ""]
    if parser.epilog:  # the command's usage examples ("examples:" and one command line a line)
        examples = [line.strip() for line in parser.epilog.splitlines()[1:] if line.strip()]
        lines += ["```bash", *examples, "```", ""]
    for title, actions in _rows(parser):
        heading = "options" if title in ("options", "optional arguments") else title
        lines += [f"**{heading}**", "", "| option | default | what |", "| --- | --- | --- |"]
        for action in actions:
            default, what = _default(action)
            if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
                what += f" (one of {', '.join(f'`{c}`' for c in action.choices)})"
            if action.required:
                what = "**required**; " + what
            lines.append(f"| {_flags(action)} | {default} | {what} |")
        lines.append("")
    return "\n".join(lines)


def render() -> str:
    from bertforge.cli import build_parser, subcommands

    parser = build_parser()
    commands = subcommands(parser)
    index = ["| command | what |", "| --- | --- |"]
    index += [f"| [`{name}`](#bertforge-{name}) | {_cell(p.description or '')} |" for name, p in commands.items()]
    body = [render_command(name, p) for name, p in commands.items()]
    return "\n".join([INTRO, *index, "", *body])


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=render()))
    return files
