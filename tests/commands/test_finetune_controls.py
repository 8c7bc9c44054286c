"""`bertforge finetune --freeze-backbone` and `--layer-lr-decay` (`bertforge.commands.finetune`): with
`--freeze-backbone` only the head and the pooler train (the embeddings and encoder stay bitwise as loaded, without
dropout); with `--layer-lr-decay F` each depth has its rate, through the shared optimizer and schedule; bad values
are refused before anything is written. (`freeze_backbone` itself: tests/finetune/test_trainer.py; the API's
settings: tests/finetune/test_api.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.cli import main
from bertforge.finetune import trainer
from tests.finetune.conftest import write_sentiment

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/commands/conftest.py

transformers = pytest.importorskip("transformers")

FAST = ["--epochs", "2", "--batch-size", "8", "--lr", "1e-2", "--no-progress"]
BACKBONE = ("bert.embeddings.", "bert.encoder.")


def run(capsys, tiny_model: Path, tmp_path: Path, *extra: str) -> Path:
    train = write_sentiment(tmp_path / "train.tsv", 24)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    out = tmp_path / "run"
    rc = main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train),
               "--dev", str(dev), "--out", str(out), *FAST, *extra])
    assert rc == 0, capsys.readouterr().err
    capsys.readouterr()
    return out


def spy_optimizer(monkeypatch) -> list:
    """The optimizers the fine-tuning trainer builds."""
    built = []
    real = trainer.make_optimizer
    monkeypatch.setattr(trainer, "make_optimizer", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    return built


def test_freeze_backbone_trains_only_the_head(tmp_path, tiny_model, capsys, monkeypatch):
    built = spy_optimizer(monkeypatch)
    modes = []
    real_step = trainer.Finetuning.forward_backward

    def forward_backward(self, batch, weights):  # the modes each training micro-batch runs in
        bert = self.model.bert
        modes.append((bert.embeddings.training, bert.encoder.training, self.model.training, bert.pooler.training))
        return real_step(self, batch, weights)

    monkeypatch.setattr(trainer.Finetuning, "forward_backward", forward_backward)
    out = run(capsys, tiny_model, tmp_path, "--freeze-backbone", "--eval-every", "1")

    before = load_file(tiny_model / "model.safetensors")  # a BertModel file: no "bert." prefix
    after = load_file(out / "model" / "model.safetensors")
    backbone = [k for k in after if k.startswith(BACKBONE)]
    assert len(backbone) == len([k for k in before if k.startswith(("embeddings.", "encoder."))]) > 0
    for key in backbone:
        assert torch.equal(after[key], before[key.removeprefix("bert.")]), key  # bitwise as loaded
    for key in ("bert.pooler.dense.weight", "classifier.weight"):  # the pooler trains with the head
        start = before.get(key.removeprefix("bert."))
        assert start is None or not torch.equal(after[key], start), key
    (optimizer,) = built
    trained = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert len(trained) == 4  # pooler and classifier, weight and bias: nothing of the backbone
    # evaluations ran between steps (--eval-every 1); every step still had the backbone in eval mode (no dropout)
    assert len(modes) == 6 and set(modes) == {(False, False, True, True)}

    reference, info = transformers.BertForSequenceClassification.from_pretrained(out / "model",
                                                                                  output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert json.loads((out / "finetune_config.json").read_text())["freeze_backbone"] is True


def test_layer_lr_decay_run(tmp_path, tiny_model, capsys, monkeypatch):
    built = spy_optimizer(monkeypatch)
    out = run(capsys, tiny_model, tmp_path, "--layer-lr-decay", "0.5", "--warmup-ratio", "0", "--log-every", "1")
    (optimizer,) = built
    # 2 layers: head and pooler 1e-2, layer 1 5e-3, layer 0 2.5e-3, embeddings 1.25e-3; all decayed to 0 at the end
    peaks = sorted({g["initial_lr"] for g in optimizer.param_groups})
    assert peaks == pytest.approx([1.25e-3, 2.5e-3, 5e-3, 1e-2])
    assert all(g["lr"] == 0.0 for g in optimizer.param_groups)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in records if r["type"] == "train"]
    assert lrs[0] == pytest.approx(1e-2)  # the log reports the head's rate
    assert json.loads((out / "finetune_config.json").read_text())["layer_lr_decay"] == 0.5


@pytest.mark.parametrize("value", ["0", "-0.1", "1.5", "nan"])
def test_cli_refuses_a_bad_layer_lr_decay_before_writing(tmp_path, tiny_model, capsys, value):
    train = write_sentiment(tmp_path / "train.tsv", 8)
    rc = main(["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(train),
               "--dev", str(train), "--out", str(tmp_path / "out"), "--layer-lr-decay", value])
    assert rc == 2
    assert f"layer_lr_decay must be a number in (0, 1] (1: off), got {float(value)}" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
