"""Fixtures of the serve tests: the tiny embedding and classification models (built once a session, only read),
and a server for each, started once per test module (`serve_helpers.ThreadServer`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertforge.serve import ServeConfig
from tests.serve.serve_helpers import DEADLINE, ThreadServer, save_models


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, Path]:
    return save_models(tmp_path_factory.mktemp("serve_models"))


@pytest.fixture(scope="module")
def embed_server(models):
    with ThreadServer(ServeConfig(model=str(models["embed"]), max_client_batch_size=8, max_body_bytes=4096)) as s:
        yield s


@pytest.fixture(scope="module")
def classify_server(models):
    with ThreadServer(ServeConfig(model=str(models["classify"]))) as s:
        yield s


@pytest.fixture(scope="module")
def rerank_server(models):
    """A cross-encoder (one label): TEI's reranker."""
    with ThreadServer(ServeConfig(model=str(models["rerank"]))) as s:
        yield s


@pytest.fixture(scope="module")
def guarded_server(models):
    """The embedding model's server with head and body deadlines of `DEADLINE` seconds."""
    with ThreadServer(ServeConfig(model=str(models["embed"]), head_timeout=DEADLINE, body_timeout=DEADLINE,
                                  max_client_batch_size=256)) as s:
        yield s


@pytest.fixture(scope="module")
def mlm_server(models):
    """The MLM model served with --pooling splade: /embed_sparse answers from its MLM head."""
    with ThreadServer(ServeConfig(model=str(models["mlm"]), pooling="splade")) as s:
        yield s
