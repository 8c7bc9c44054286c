"""Fixtures of the sentence-embedding training tests: the tiny model, the toy task's files, and a short run on them.

Built once per session: the tests only read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.cli import main
from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, TRAIN_TEMPLATES, make_model, pairs, write_tsv


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("toy")
    return (write_tsv(root / "train.tsv", pairs(TRAIN_TEMPLATES), "anchor\tpositive"),
            write_tsv(root / "dev.tsv", pairs(DEV_TEMPLATES)))


@pytest.fixture(scope="session")
def trained(tiny, toy, tmp_path_factory) -> Path:
    """A short run on the toy task through the command line, with most training options set."""
    out = tmp_path_factory.mktemp("runs") / "trained"
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--dev", str(toy[1]), "--out", str(out),
               "--epochs", "6", "--batch-size", "16", "--lr", "1e-3", "--warmup-ratio", "0.1", "--weight-decay", "0.01",
               "--seed", "1", "--log-every", "2", "--eval-every", "8", "--early-stop", "20", "--eval-batch-size", "8",
               "--max-length", "16", "--pooling", "mean", "--max-skipped-steps", "3", "--device", "cpu",
               "--no-progress"])
    assert rc == 0
    return out
