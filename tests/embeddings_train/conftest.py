"""Fixtures of the sentence-embedding training tests: the tiny model, the toy task's files, and a short run on them.

Built once per session: the tests only read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.embeddings_train.embeddings_train_helpers import make_mlm_model, make_model, train_on_toy_task, write_toy_task


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_mlm(tmp_path_factory) -> Path:
    return make_mlm_model(tmp_path_factory.mktemp("tiny_mlm"))


@pytest.fixture(scope="session")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    return write_toy_task(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="session")
def trained(tiny, toy, tmp_path_factory) -> Path:
    """A short run on the toy task through the command line, with most training options set."""
    return train_on_toy_task(tiny, toy, tmp_path_factory.mktemp("runs") / "trained")
