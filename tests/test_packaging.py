"""The package installs beside others: one version source, a LICENSE that matches the declared licence, py.typed
shipped as package data (#33)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import bertforge

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bertforge.__version__"}
    assert importlib.metadata.version("bertforge") == bertforge.__version__


def test_licence_file_and_typing_marker_ship():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text(encoding="utf-8").splitlines()[0]
    assert (Path(bertforge.__file__).parent / "py.typed").is_file()
    assert "py.typed" in project["tool"]["setuptools"]["package-data"]["bertforge"]
