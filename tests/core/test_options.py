"""`bertforge.core.options`: a dataclass field declares its command-line option once; the parser is generated from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from bertforge.core.options import add_options, cli_fields, flag_of, given, option


@dataclasses.dataclass
class Settings:
    name: str = option(help="a required path", metavar="PATH")
    steps: int = option(10, "how many steps")
    lr: float = option(1e-3, "the rate", metavar="LR")
    kind: str = option("a", "one of two", choices=("a", "b"))
    lowercase: bool = option(True, "keep case", flag="--cased")
    verbose: bool = option(False, "say more")
    progress: bool | None = option(None, "no bars", flag="--no-progress")
    files: list[str] = option(help="inputs", default_factory=list, metavar="FILE")
    limit: int | None = option(None, "an optional cap", metavar="N")
    hidden: int = 3  # not an option


def parse(*argv: str, **kw) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, Settings, **kw)
    return parser.parse_args(list(argv))


def test_only_fields_with_an_option_become_options():
    assert [f.name for f in cli_fields(Settings)] == ["name", "steps", "lr", "kind", "lowercase", "verbose", "progress",
                                                       "files", "limit"]
    assert [flag_of(f) for f in cli_fields(Settings, only=("lowercase", "files"))] == ["--cased", "--files"]


def test_nothing_given_changes_nothing():
    args = parse()
    assert given(args, Settings) == {}
    base = Settings(name="x")
    assert dataclasses.replace(base, **given(args, Settings)) == base


def test_each_option_sets_its_field_with_its_type():
    args = parse("--name", "p", "--steps", "7", "--lr", "0.5", "--kind", "b", "--cased", "--verbose", "--no-progress",
                 "--files", "a.txt", "b.txt", "--limit", "4")
    assert given(args, Settings) == dict(name="p", steps=7, lr=0.5, kind="b", lowercase=False, verbose=True,
                                         progress=False, files=["a.txt", "b.txt"], limit=4)


def test_a_switch_sets_the_other_value_than_the_default():
    assert given(parse("--cased"), Settings) == {"lowercase": False}  # default True: the switch turns it off
    assert given(parse("--verbose"), Settings) == {"verbose": True}
    assert given(parse("--no-progress"), Settings) == {"progress": False}  # no default: "--no-" turns it off


def test_choices_types_and_required_are_enforced_by_the_parser(capsys):
    for argv in (["--kind", "c"], ["--steps", "many"], ["--lr", "fast"]):
        with pytest.raises(SystemExit):
            parse(*argv)
    with pytest.raises(SystemExit):
        parse(required=("name",))
    assert parse("--name", "p", required=("name",)).name == "p"


def test_help_shows_the_dataclass_default_and_notes():
    parser = argparse.ArgumentParser()
    add_options(parser, Settings, notes={"steps": "demo 600"})
    text = " ".join(parser.format_help().split())
    assert "how many steps (default 10); demo 600" in text
    assert "--cased keep case" in text and "(default True)" not in text  # switches show no default
