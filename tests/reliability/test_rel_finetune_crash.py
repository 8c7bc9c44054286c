"""Crash safety of fine-tuning: `bertforge finetune` runs as a subprocess, is SIGKILLed at random moments (some timed
to land inside a checkpoint write) and relaunched with `--resume` until it finishes, as pretraining is in
test_rel_crash.py (the same campaign, from rel_helpers).

After every kill the newest complete checkpoint must load; at the end the final weights (the best evaluation's)
must be bitwise equal to those of a run never interrupted, metrics.jsonl the same, and the last launch must say it
resumed from the newest checkpoint. A checkpoint every step, an evaluation every other step and a loss row every
third put kills between every kind of event.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge import BertForSequenceClassification
from bertforge.core.state import load_state
from tests.reliability.rel_helpers import Reference, Subject, bertforge_cmd, kill_campaign, run_reference
from tests.finetune.conftest import vocabulary, write_sentiment
from tests.helpers import tiny_config, write_uncased_tokenizer


def finetune_argv(inputs: tuple[Path, Path, Path], out: Path, resume: bool) -> list[str]:
    model, train, dev = inputs
    argv = bertforge_cmd(
        "finetune", "--task", "classification", "--model", str(model), "--train", str(train), "--dev", str(dev),
        "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3", "--eval-every", "2",
        "--log-every", "3", "--save-every", "1", "--keep-checkpoints", "2", "--device", "cpu", "--no-progress",
    )
    return argv + ["--resume"] if resume else argv


def verify_checkpoint(path: Path, step: int) -> None:
    """Everything a resume reads, read the way it reads it."""
    trainer = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    assert trainer["step"] == step, (path, trainer)
    BertForSequenceClassification.from_pretrained(path)  # config.json + model.safetensors, checked
    for name in ("optimizer", "scheduler", "rng", "data", "evaluation"):
        load_state(path, name)


@pytest.fixture(scope="module")
def subject(tmp_path_factory) -> Subject:
    root = tmp_path_factory.mktemp("finetune_crash_inputs")
    model = root / "model"
    write_uncased_tokenizer(model, vocabulary())
    torch.manual_seed(0)
    from bertforge import BertModel

    BertModel(tiny_config(vocab_size=len(vocabulary()))).save_pretrained(model)
    inputs = (model, write_sentiment(root / "train.tsv", 24), write_sentiment(root / "dev.tsv", 8))
    return Subject(lambda out, resume: finetune_argv(inputs, out, resume), "finetune_config.json", verify_checkpoint)


@pytest.fixture(scope="module")
def reference(subject, tmp_path_factory) -> Reference:
    """The same run, never interrupted."""
    return run_reference(subject, tmp_path_factory.mktemp("finetune_reference") / "run")


@pytest.mark.slow  # a launch is a few seconds of start-up: the fast suite resumes in-process (tests/finetune/test_resume.py)
def test_finetune_sigkill_and_resume_20_kills(subject, reference, tmp_path):
    tally = kill_campaign(subject, reference, tmp_path, kills=20, seed=55, per_episode=5)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 20
    assert tally.inside_save >= 2, "too few kills landed inside a checkpoint write to say anything about it"
