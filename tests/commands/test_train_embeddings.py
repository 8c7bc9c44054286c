"""`bertforge train-embeddings` (`bertforge.commands.train_embeddings`): its options become the run's
`EmbeddingsConfig`, the run's summary is printed as JSON, and a missing required option is one line."""

from __future__ import annotations

import json

import pytest

import bertforge.embeddings_train
from bertforge.cli import main
from bertforge.embeddings_train import EmbeddingsConfig


def test_the_options_become_the_runs_config(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bertforge.embeddings_train, "train_embeddings",
                        lambda config: seen.append(config) or {"best": {"spearman": 0.5}})
    assert main(["train-embeddings", "--model", "m", "--train", "pairs.tsv", "--out", "o", "--loss", "cosent",
                 "--batch-size", "16", "--lr", "3e-5", "--no-normalize", "--symmetric"]) == 0
    assert seen == [EmbeddingsConfig(model="m", train="pairs.tsv", out="o", loss="cosent", batch_size=16, lr=3e-5,
                                     normalize=False, symmetric=True)]  # the rest: EmbeddingsConfig's defaults
    assert json.loads(capsys.readouterr().out) == {"best": {"spearman": 0.5}}


def test_a_missing_required_option_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train-embeddings", "--model", "m", "--train", "pairs.tsv"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and "--out" in err
