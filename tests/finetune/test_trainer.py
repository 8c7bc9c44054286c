"""The fine-tuning trainer's learning-rate schedule (linear warm-up, then linear decay to 0; the one schedule of
`bertforge.training.optim`) at its boundary steps, directly and as logged by a real run, its AdamW parameter groups (no
decay for biases and LayerNorm weights), and `freeze_backbone` on every family."""

from __future__ import annotations

import json

import pytest
import torch

from bertforge import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification
from bertforge.finetune import finetune, trainer
from bertforge.training.optim import parameter_groups, warmup_decay

from .conftest import write_sentiment

BASE_LR = 0.1
BACKBONE = ("bert.embeddings.", "bert.encoder.")


def lrs(warmup: int, total: int, steps: int) -> list[float]:
    """The learning rate in force at steps 0..steps (after that many scheduler steps)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=BASE_LR)
    scheduler = warmup_decay(optimizer, warmup, total)
    seen = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
        seen.append(optimizer.param_groups[0]["lr"])
    return seen


def test_linear_schedule_boundary_steps():
    warmup, total = 4, 10
    lr = lrs(warmup, total, total + 2)
    # warm-up: step s runs at lr x (s + 1) / warmup, so the first update is not wasted at 0
    assert lr[0] == pytest.approx(0.025)
    assert lr[1] == pytest.approx(0.05)
    assert lr[warmup - 1] == pytest.approx(BASE_LR)  # the last warm-up step reaches the peak
    assert lr[warmup] == pytest.approx(BASE_LR)  # the first decay step starts from it
    # decay: lr x (1 - (s - warmup) / (total - warmup)), to 0 at `total`
    assert lr[warmup + 1] == pytest.approx(BASE_LR * 5 / 6)
    assert lr[total - 1] == pytest.approx(BASE_LR / 6)
    assert lr[total] == 0.0
    assert lr[total + 1] == lr[total + 2] == 0.0  # never negative past the end
    assert all(a < b for a, b in zip(lr[:warmup], lr[1:warmup]))  # rising throughout the warm-up
    assert all(a > b for a, b in zip(lr[warmup : total + 1], lr[warmup + 1 : total + 1]))  # then falling


def test_linear_schedule_without_warmup_starts_at_the_peak():
    lr = lrs(0, 4, 4)
    assert lr == pytest.approx([0.1, 0.075, 0.05, 0.025, 0.0])


def test_linear_schedule_with_warmup_over_every_step_only_rises():
    lr = lrs(5, 5, 6)  # steps 0-4 run; at step 5 = total the run is over and the rate is 0
    assert lr == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1, 0.0, 0.0])


def test_finetune_logs_the_schedule_its_warmup_ratio_asks_for(tiny_model, tmp_path):
    """32 rows in batches of 8 for 2 epochs: 8 optimizer steps; warmup_ratio 0.25: 2 warm-up steps. The lr logged
    with step k (1-based) is the one that step used: lr x k/2 while k <= 2, then lr x (1 - (k - 3)/6)."""
    train = write_sentiment(tmp_path / "train.tsv", 32)
    dev = write_sentiment(tmp_path / "dev.tsv", 8)
    finetune(task="classification", model=str(tiny_model), train=str(train), dev=str(dev), out=str(tmp_path / "out"),
             epochs=2, batch_size=8, lr=1e-3, warmup_ratio=0.25, log_every=1, progress=False)
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["type"] == "train"]
    assert [r["step"] for r in train_records] == list(range(1, 9))
    expected = [1e-3 * f for f in (1 / 2, 1, 1, 5 / 6, 4 / 6, 3 / 6, 2 / 6, 1 / 6)]
    assert [r["lr"] for r in train_records] == pytest.approx(expected, abs=1e-12)


def test_a_run_of_few_optimizer_steps_says_so_in_one_line_with_its_numbers(tiny_model, tmp_path, caplog):
    """README's quick start (16 rows, one batch, 3 epochs: 3 steps) stayed at chance without a word: under
    `trainer.FEW_STEPS` optimizer steps a run warns at its start, naming the count and the options to change."""
    import logging

    train = write_sentiment(tmp_path / "train.tsv", 16)
    dev = write_sentiment(tmp_path / "dev.tsv", 4)

    def warnings_of(out: str, **settings) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bertforge"):
            finetune(task="classification", model=str(tiny_model), train=str(train), dev=str(dev),
                     out=str(tmp_path / out), progress=False, **settings)
        return [r.getMessage() for r in caplog.records if "optimizer step" in r.getMessage()]

    (line,) = warnings_of("few", epochs=3, batch_size=16)
    assert line == ("fine-tuning: only 3 optimizer steps (16 features, batch 16, 3 epochs): the model will barely move "
                    "from where it starts; use more rows, a smaller --batch-size, or more --epochs")
    (line,) = warnings_of("accumulated", epochs=1, batch_size=4, grad_accum=2)
    assert "only 2 optimizer steps (16 features, batch 4 x 2 accumulated, 1 epoch)" in line
    assert "a smaller --batch-size or --grad-accum" in line
    assert trainer.FEW_STEPS == 10 and warnings_of("enough", epochs=3, batch_size=4) == []  # 12 steps


def names_in(groups: list[dict], model: torch.nn.Module) -> list[set[str]]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return [{by_id[id(p)] for p in g["params"]} for g in groups]


def test_parameter_groups_decay_matrices_and_embeddings_only():
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16, num_labels=3)
    model = BertForSequenceClassification(config)
    model.bert.pooler.requires_grad_(False)  # frozen weights belong to no group
    groups = parameter_groups(model, 0.01)
    assert [g["weight_decay"] for g in groups] == [0.01, 0.0]
    decay, no_decay = names_in(groups, model)
    assert sum(len(g["params"]) for g in groups) == len(decay) + len(no_decay)  # each tensor once
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert decay | no_decay == set(trainable) and not decay & no_decay
    assert "bert.pooler.dense.weight" not in decay | no_decay
    # the rule stated by hand: 2-D tensors (matrices, embedding tables) decay, 1-D ones (biases, LayerNorm) do not
    assert decay == {n for n, p in trainable.items() if p.dim() == 2}
    assert no_decay == {n for n, p in trainable.items() if p.dim() == 1}
    for name in ("bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                 "bert.encoder.layer.1.attention.self.query.weight", "bert.encoder.layer.0.output.dense.weight",
                 "classifier.weight"):
        assert name in decay
    for name in ("bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias",
                 "bert.encoder.layer.0.attention.output.LayerNorm.weight", "bert.encoder.layer.1.output.LayerNorm.weight",
                 "bert.encoder.layer.1.intermediate.dense.bias", "classifier.bias"):
        assert name in no_decay
    assert len(decay) == 3 + 2 * 6 + 1 and len(no_decay) == 2 + 2 * 10 + 1  # counted from the layout


@pytest.mark.parametrize("family", ["roberta", "albert", "distilbert"])
def test_freeze_backbone_leaves_every_familys_head_trainable(family):
    model = AutoModelForSequenceClassification.from_config(
        BertConfig.preset(f"{family}-tiny", vocab_size=50, num_labels=3))
    trainer.freeze_backbone(model)
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    heads = {"roberta": "classifier.", "distilbert": "classifier.", "albert": ("classifier.", "bert.pooler.")}
    assert trainable and all(n.startswith(heads[family]) for n in trainable), trainable
    assert all(not p.requires_grad for n, p in model.named_parameters() if n.startswith(BACKBONE))
