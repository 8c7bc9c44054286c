"""`bertforge train-embeddings` (`bertforge.commands.train_embeddings`): its options become the run's
`EmbeddingsConfig`, the run's summary is printed as JSON, and a missing required option is one line."""

from __future__ import annotations

import json


import bertforge.embeddings_train
from bertforge.cli import main
from bertforge.embeddings_train import EmbeddingsConfig


def test_the_options_become_the_runs_config(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bertforge.embeddings_train, "train_embeddings",
                        lambda **settings: seen.append(EmbeddingsConfig(**settings)) or {"best": {"spearman": 0.5}})
    assert main(["train-embeddings", "--model", "m", "--train", "pairs.tsv", "--out", "o", "--loss", "cosent",
                 "--batch-size", "16", "--lr", "3e-5", "--no-normalize", "--symmetric"]) == 0
    assert seen == [EmbeddingsConfig(model="m", train="pairs.tsv", out="o", loss="cosent", batch_size=16, lr=3e-5,
                                     normalize=False, symmetric=True)]  # the rest: EmbeddingsConfig's defaults
    assert json.loads(capsys.readouterr().out) == {"best": {"spearman": 0.5}}


def test_the_adapter_options_are_finetunes(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(bertforge.embeddings_train, "train_embeddings",
                        lambda **settings: seen.append(EmbeddingsConfig(**settings)) or {})
    assert main(["train-embeddings", "--model", "m", "--train", "pairs.tsv", "--out", "o", "--lora-rank", "8",
                 "--lora-alpha", "32", "--lora-dropout", "0.05", "--lora-targets", "query", "key", "value",
                 "--merge"]) == 0
    assert seen == [EmbeddingsConfig(model="m", train="pairs.tsv", out="o", lora_rank=8, lora_alpha=32.0,
                                     lora_dropout=0.05, lora_targets=["query", "key", "value"], merge=True)]


def test_a_missing_required_option_is_one_line(capsys):
    assert main(["train-embeddings", "--model", "m", "--train", "pairs.tsv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing required option(s): --out" in err


def test_run_config_and_resume_start_from_the_recorded_settings(monkeypatch, tmp_path):
    """--run-config FILE (or the run's directory) repeats a recorded run, the options given overriding it; --resume
    --out RUN alone continues RUN with its own settings."""
    seen = []
    monkeypatch.setattr(bertforge.embeddings_train, "train_embeddings", lambda **s: seen.append(s) or {})
    run = tmp_path / "run"
    run.mkdir()
    recorded = {**EmbeddingsConfig(model="m", train="pairs.tsv", out=str(run), loss="cosent", lr=3e-5).to_dict(),
                "resume": False, "overwrite": True, "versions": {"bertforge": "0.1.0"}}
    (run / "train_embeddings_config.json").write_text(json.dumps(recorded))
    assert main(["train-embeddings", "--run-config", str(run), "--out", "again", "--seed", "7"]) == 0
    config = EmbeddingsConfig(**seen[-1])
    assert (config.loss, config.lr, config.seed, config.out, config.overwrite) == ("cosent", 3e-5, 7, "again", False)
    assert main(["train-embeddings", "--resume", "--out", str(run)]) == 0
    config = EmbeddingsConfig(**seen[-1])
    assert (config.loss, config.model, config.resume, config.out) == ("cosent", "m", True, str(run))
