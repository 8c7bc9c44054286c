"""Helpers shared by the command tests of `tests/commands/` (their fixtures are in `tests/commands/conftest.py`)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from bertforge.cli import main
from bertforge.finetune import trainer
from tests import helpers

#: The words of the tiny pretraining inputs (`conftest.tiny`): `helpers.WORDS` and three long words of several pieces.
WORDS = [*helpers.WORDS, "unbelievable", "lighthouses", "wanderings"]

#: One short fine-tuning epoch (finetune, evaluate, predict).
FAST = ["--epochs", "1", "--batch-size", "8", "--lr", "1e-3", "--no-progress"]


def sentences(rng: random.Random, words: list[str], n: int) -> list[str]:
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))) + " ." for _ in range(n)]


def recorded_batches(monkeypatch) -> list[dict[str, torch.Tensor]]:
    batches = []
    real = trainer.collate
    monkeypatch.setattr(trainer, "collate", lambda features, pad: batches.append(real(features, pad)) or batches[-1])
    return batches


def finetune(capsys, tiny_model: Path, task: str, train: Path, dev: Path, out: Path, *extra: str) -> dict:
    rc = main(["finetune", "--task", task, "--model", str(tiny_model), "--train", str(train), "--dev", str(dev),
               "--out", str(out), *FAST, *extra])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    return json.loads(captured.out)
