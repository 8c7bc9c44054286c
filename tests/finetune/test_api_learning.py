"""Fine-tuning learns: a tiny randomly initialised BERT, fine-tuned through `bertforge.finetune.finetune` on small
separable data (one word decides the answer), must reach a dev score far above chance on new sentences, with a
falling training loss and weights that moved away from the starting checkpoint.

A trainer that never updates its weights fails every test here (tried: optimizer.step() removed). Each bar states
what was measured beside it (fine-tuning seeds 0-3, each with its own training sentences; the dev set is fixed);
the three runs take about 8 s together on one core of a busy machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Callable
from typing import Any

from safetensors.torch import load_file

from bertforge.finetune import finetune

from .conftest import write_separable_conll, write_separable_sentiment, write_separable_squad

TRAIN_ROWS, DEV_ROWS = 128, 64
COMMON = dict(batch_size=16, lr=3e-3, progress=False, log_every=10_000)  # log_every: one loss record per epoch


def learn(tiny_model: Path, tmp_path: Path, task: str, write: Callable[[Path, int, int], Path], seed: int = 0,
          **settings: Any) -> tuple[dict[str, Any], list[float], dict[str, float]]:
    """Fine-tune on fresh training rows; return the summary, each epoch's mean training loss, and the largest
    change of each tensor of the starting checkpoint (by name in the fine-tuned model)."""
    suffix = {"classification": ".tsv", "ner": ".conll", "qa": ".json"}[task]
    train = write(tmp_path / f"train{suffix}", TRAIN_ROWS, 100 + seed)
    dev = write(tmp_path / f"dev{suffix}", DEV_ROWS, 999)
    out = tmp_path / "run"
    summary = finetune(task=task, model=str(tiny_model), train=str(train), dev=str(dev), out=str(out), seed=seed,
                       **COMMON, **settings)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses) == settings["epochs"]  # one record per epoch, the epoch's mean loss
    start = load_file(str(tiny_model / "model.safetensors"))
    tuned = load_file(str(out / "model" / "model.safetensors"))
    moved = {name: (tuned[f"bert.{name}"] - tensor).abs().max().item()
             for name, tensor in start.items() if f"bert.{name}" in tuned}
    return summary, losses, moved


def check_moved(moved: dict[str, float]) -> None:
    """Every tensor of the encoder moved. The attention key biases are left out: softmax over the keys ignores a
    shift shared by all of them, so their gradient is zero up to rounding (measured changes 5e-8 to 3e-5)."""
    trained = {name: delta for name, delta in moved.items() if not name.endswith("attention.self.key.bias")}
    assert len(trained) >= 33, sorted(moved)  # 5 embedding tensors + 2 layers x 14 (+ the pooler's 2 if used)
    # measured min 9e-3 (classification), 1.8e-2 (ner), 1.7e-4 (qa: its best checkpoint is after 8 steps)
    assert min(trained.values()) > 5e-5, {n: d for n, d in trained.items() if d <= 5e-5}


def test_classification_learns_a_separable_task(tiny_model, tmp_path):
    summary, losses, moved = learn(tiny_model, tmp_path, "classification", write_separable_sentiment,
                                   epochs=8, max_length=16)
    # chance is 0.5 (the dev set is balanced); the same run with lr 1e-12 scores 0.50 (seeds 0-1)
    assert summary["metrics"]["accuracy"] >= 0.9  # measured 1.00 over seeds 0-3
    assert losses[-1] < 0.25 * losses[0]  # measured last/first 0.04-0.13 (first epoch 0.69-0.70, about ln 2)
    check_moved(moved)


def test_token_classification_learns_a_separable_task(tiny_model, tmp_path):
    summary, losses, moved = learn(tiny_model, tmp_path, "ner", write_separable_conll, epochs=6, max_length=24)
    # the same run with lr 1e-12 scores entity F1 0.26 (seeds 0-1)
    assert summary["metrics"]["f1"] >= 0.9  # measured 1.00 over seeds 0-3
    assert summary["metrics"]["per_type"]["ORG"]["f1"] >= 0.9  # two-word entities (B-ORG I-ORG) too; measured 1.00
    assert losses[-1] < 0.25 * losses[0]  # measured last/first 0.13-0.15 (first epoch 1.47-1.50)
    check_moved(moved)


def test_question_answering_learns_a_separable_task(tiny_model, tmp_path):
    summary, losses, moved = learn(tiny_model, tmp_path, "qa", write_separable_squad, epochs=6, max_length=32,
                                   doc_stride=16)
    # the same run with lr 1e-12 scores exact match 0-3 and F1 8-17 (seeds 0-1)
    assert summary["metrics"]["exact"] >= 80  # measured 98.4-100 over seeds 0-3
    assert summary["metrics"]["f1"] >= 80  # measured 98.4-100
    assert losses[-1] < 0.25 * losses[0]  # measured last/first 0.087-0.096 (first epoch 2.5-2.7)
    check_moved(moved)
