"""The package installs beside others: one version source, a LICENSE that matches the declared licence, py.typed
shipped as package data, the pictures as the `plots` extra and torch as the tested line (#33)."""

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


def test_plots_are_an_extra_the_tests_install_and_torch_is_the_tested_line():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = lambda reqs: {r.split(">")[0].split("=")[0].split("<")[0].split(";")[0].strip() for r in reqs}  # noqa: E731
    extras = project["optional-dependencies"]
    assert not names(project["dependencies"]) & {"matplotlib", "tensorboard"}
    assert names(extras["plots"]) == {"matplotlib", "tensorboard"} <= names(extras["test"])
    assert names(extras["learn"]) <= names(extras["test"])  # the tests run the course's pages
    assert "torch>=2.13,<2.14" in project["dependencies"]  # the line the tests run with: still the CPU wheel here
    assert importlib.metadata.version("torch").startswith("2.13.")
