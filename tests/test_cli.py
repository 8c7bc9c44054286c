"""`bertforge.cli`: the `bertforge` command line itself (its own options; the commands' are in tests/commands/)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bertforge.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys):
    import importlib.metadata

    version = importlib.metadata.version("bertforge")  # the installed package's (one source: tests/test_packaging.py)
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"bertforge {version}"


def test_a_missing_command_module_fails_loudly(monkeypatch, capsys):
    """Every name in COMMANDS must be built: a missing module is a bug, reported, never skipped."""
    import bertforge.cli as cli

    monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, "no_such_command"])
    with pytest.raises(ModuleNotFoundError, match="no_such_command"):
        cli.build_parser()
    assert main(["pretrain", "--help"]) == 1
    err = capsys.readouterr().err
    assert "internal error: ModuleNotFoundError" in err and "no_such_command" in err
