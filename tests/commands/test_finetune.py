"""`bertforge finetune` (`bertforge.commands.finetune`): each option reaches the run's settings and changes what
its help says (the schedule, the parameter groups, the batches). Whole runs of every task:
test_finetune_end_to_end.py; --freeze-backbone and --layer-lr-decay: test_finetune_controls.py; --precision and
--compile: test_finetune_precision_compile.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.finetune import api, trainer
from tests.finetune.conftest import write_sentiment

from .cmd_helpers import FAST

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py


def finetune_config(monkeypatch, *argv: str):
    seen = []
    monkeypatch.setattr(api, "finetune", lambda config: seen.append(config) or {})
    monkeypatch.setattr("bertforge.finetune.finetune", api.finetune)
    assert main(["finetune", "--task", "classification", "--model", "m", "--train", "t", "--dev", "d", "--out", "o",
                 *argv]) == 0
    (config,) = seen
    return config


FINETUNE_OPTIONS = [
    (["--warmup-ratio", "0.5"], dict(warmup_ratio=0.5)),
    (["--weight-decay", "0.3"], dict(weight_decay=0.3)),
    (["--group-by-length"], dict(group_by_length=True)),
    (["--text-pair-column", "b"], dict(text_pair_column="b")),
    (["--label-separator", "|"], dict(label_separator="|")),
    (["--max-query-length", "9"], dict(max_query_length=9)),
    (["--max-answer-length", "2"], dict(max_answer_length=2)),
    (["--n-best", "3"], dict(n_best=3)),
    (["--eval-batch-size", "5"], dict(eval_batch_size=5)),
    (["--lora-rank", "4"], dict(lora_rank=4)),
    (["--lora-rank", "2", "--lora-alpha", "4", "--lora-dropout", "0.1", "--lora-targets", "query", "ffn_in",
      "--merge"], dict(lora_rank=2, lora_alpha=4.0, lora_dropout=0.1, lora_targets=["query", "ffn_in"], merge=True)),
]


@pytest.mark.parametrize("argv,changed", FINETUNE_OPTIONS, ids=[" ".join(a) for a, _ in FINETUNE_OPTIONS])
def test_finetune_option_sets_its_setting_and_nothing_else(monkeypatch, argv, changed):
    base = finetune_config(monkeypatch).to_dict()
    got = finetune_config(monkeypatch, *argv).to_dict()
    assert {k: v for k, v in got.items() if base[k] != v} == changed


def run_finetune(capsys, tiny_model: Path, tmp_path: Path, *extra: str) -> Path:
    train = write_sentiment(tmp_path / "train.tsv", 24)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    rc = main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train),
               "--dev", str(dev), "--out", str(out), *FAST, *extra])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


def test_finetune_warmup_ratio_and_weight_decay(tmp_path, tiny_model, capsys, monkeypatch):
    import bertforge.training.optim

    groups = []
    real = bertforge.training.optim.parameter_groups  # the one rule every trainer's optimizer is built with
    monkeypatch.setattr(bertforge.training.optim, "parameter_groups", lambda model, wd: groups.append(real(model, wd)) or groups[-1])
    out = run_finetune(capsys, tiny_model, tmp_path, "--epochs", "2", "--batch-size", "4", "--log-every", "1",
                       "--warmup-ratio", "0.5", "--weight-decay", "0.3")
    lrs = [r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "train"]
    # 24 examples, batch 4, 2 epochs: 12 steps, 6 of them (half) rising to the peak, then falling towards 0 at step 12
    assert lrs == pytest.approx([1e-3 * s / 6 for s in range(1, 7)] + [1e-3 * (12 - s) / 6 for s in range(6, 12)])
    assert sorted(g["weight_decay"] for g in groups[-1]) == [0.0, 0.3]
    assert all(p.ndim == 1 for p in groups[-1][1]["params"])  # no decay: biases and LayerNorm weights


def test_finetune_batches_are_plain_shuffled_unless_grouped_by_length(tmp_path, tiny_model, capsys, monkeypatch):
    made = []
    real = trainer.training_batches

    def recording(lengths, batch_size, generator, group_by_length):
        batches = real(lengths, batch_size, generator, group_by_length)
        made.append([[lengths[i] for i in b] for b in batches])
        return batches

    monkeypatch.setattr(trainer, "training_batches", recording)
    run_finetune(capsys, tiny_model, tmp_path, "--batch-size", "4", "--group-by-length")
    assert all(b == sorted(b, reverse=True) for b in made[-1])  # grouped: each batch of similar, sorted lengths
    run_finetune(capsys, tiny_model, tmp_path, "--batch-size", "4")
    assert any(b != sorted(b, reverse=True) for b in made[-1])  # the default: plain shuffled batches
