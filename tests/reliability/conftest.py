"""Reliability figures (kills survived, corrupt files tried, ...) are printed by each test and repeated at the end
of the session, so they show without `pytest -s` too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability import rel_helpers
from tests.helpers import TINY_CONFIG, make_corpus
from tests.reliability.rel_helpers import make_model_dir


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if rel_helpers.FIGURES:
        terminalreporter.section("reliability figures")
        for line in rel_helpers.FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """A tiny pretrained model and a tiny classifier (labels neg/pos), both with a tokenizer."""
    from bertforge import BertConfig, BertForSequenceClassification
    from bertforge.tokenizer import Tokenizer

    root = tmp_path_factory.mktemp("models")
    corpus = make_corpus(root / "corpus.txt")
    tok = Tokenizer.train([str(corpus)], vocab_size=TINY_CONFIG["vocab_size"], show_progress=False)
    tok.save_pretrained(root / "tok")
    pretrained = make_model_dir(root / "pretrained", tokenizer_dir=root / "tok")
    config = BertConfig(**TINY_CONFIG, num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1},
                        architectures=["BertForSequenceClassification"])
    classifier = BertForSequenceClassification(config)
    classifier.save_pretrained(root / "classifier")
    tok.save_pretrained(root / "classifier")
    return {"pretrained": pretrained, "classifier": root / "classifier", "corpus": corpus}
