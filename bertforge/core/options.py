"""Settings declared once: a dataclass field carries its own command-line option (help, flag, choices), and the
commands generate their argparse options from the dataclass.

    @dataclass
    class RunSettings:
        lr: float = option(1e-4, "peak learning rate")
        nsp: bool = option(True, "next-sentence prediction", flag="--no-nsp")  # a flag that turns a default off

    add_options(parser, RunSettings)             # --lr LR, --no-nsp
    settings = dataclasses.replace(RunSettings(), **given(args, RunSettings))

Every generated option defaults to None, meaning "not given", so the default lives in the dataclass alone and a
command can start from another base (a saved config, the demo's settings) and change only what was given.
The Python API, which takes the same settings as keywords, checks them with `check_choices`.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from .errors import BertforgeError

_MISSING: Any = dataclasses.MISSING
_TYPES: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str}


def option(
    default: Any = _MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    metavar: str | None = None,
    choices: Collection[str] | None = None,
    default_factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field that is also a command-line option `--field-name` (or `flag`).

    A bool field is a switch to the other value than its default (`flag="--cased"` on a `lowercase=True` field
    sets it False; without a default, a flag starting with `--no-` sets False). A `list[str]` field takes one or
    more values. `choices` is kept as given where it is a sequence: a registry's live view of its names
    (`--objective`'s) stays current; any other collection becomes a tuple."""
    if choices and not isinstance(choices, Sequence):
        choices = tuple(choices)  # a dict's keys (PRECISIONS'): argparse's choices are read as a sequence
    cli = {"help": help, "flag": flag, "metavar": metavar, "choices": choices or None}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata={"cli": cli})
    return dataclasses.field(default=default, metadata={"cli": cli})


def same_option(cls: type, name: str) -> Any:
    """The field `name` of settings class `cls` (its default, help, flag), for another settings class that offers
    the same option: one spelling and one help for both."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=f.default, metadata=dict(f.metadata))


def check_choices(settings: Any) -> None:
    """Refuse a setting outside its declared `choices` (the command line's parser checks them; this is for the
    Python API, where the same settings come as keywords), naming the field, the value and the choices."""
    for f in cli_fields(type(settings)):
        choices, value = f.metadata["cli"]["choices"], getattr(settings, f.name)
        if choices and value is not None and value not in choices:
            raise BertforgeError(f"{f.name} must be one of {', '.join(map(str, choices))}, got {value!r}")


def cli_fields(cls: type, only: Collection[str] | None = None) -> list[dataclasses.Field]:
    """The fields of dataclass `cls` that are command-line options (those of `only`, in `cls`'s order)."""
    return [f for f in dataclasses.fields(cls) if "cli" in f.metadata and (only is None or f.name in only)]


def flag_of(f: dataclasses.Field) -> str:
    return f.metadata["cli"]["flag"] or "--" + f.name.replace("_", "-")


def _default_text(f: dataclasses.Field) -> str:
    if f.default is _MISSING or f.default is None or isinstance(f.default, bool):
        return ""
    return f" (default {f.default})"


def add_options(
    parser: argparse.ArgumentParser | Any,
    cls: type,
    *,
    only: Collection[str] | None = None,
    required: Collection[str] = (),
    notes: dict[str, str] | None = None,
) -> None:
    """Add an option for each command-line field of `cls` (or of `only`) to `parser` (or an argument group).

    `required`: fields the command cannot run without; `notes`: text appended to a field's help."""
    notes = notes or {}
    for f in cli_fields(cls, only):
        cli = f.metadata["cli"]
        flag = flag_of(f)
        help_text = cli["help"] + _default_text(f) + (f"; {notes[f.name]}" if f.name in notes else "")
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": help_text}
        kind = str(f.type).replace(" | None", "").strip()
        if kind == "bool":
            switch = not f.default if isinstance(f.default, bool) else not flag.startswith("--no-")
            kwargs.update(action="store_const", const=switch)
        else:
            if kind == "list[str]":
                kwargs["nargs"] = "+"
            else:
                kwargs["type"] = _TYPES[kind]
            kwargs.update(metavar=cli["metavar"], choices=cli["choices"], required=f.name in required)
        parser.add_argument(flag, **kwargs)


def given(args: argparse.Namespace, cls: type, only: Collection[str] | None = None) -> dict[str, Any]:
    """The command-line fields of `cls` (or of `only`) that were given on the command line, by field name."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls, only) if getattr(args, f.name, None) is not None}
