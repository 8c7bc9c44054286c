"""Fixtures shared by the tests of every directory (plain helpers are in `tests/helpers.py`)."""

from __future__ import annotations

import pytest

from tests.helpers import make_run_inputs


@pytest.fixture(scope="module")
def corpus_and_tokenizer(tmp_path_factory):
    """(corpus.txt, tokenizer dir, config.json) of a tiny pretraining run (`helpers.make_run_inputs`)."""
    return make_run_inputs(tmp_path_factory.mktemp("pretrain"))
