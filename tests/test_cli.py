"""`bertforge.cli`: the `bertforge` command line itself (its own options; the commands' are in tests/commands/)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from bertforge.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version(capsys):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"bertforge {version}"
