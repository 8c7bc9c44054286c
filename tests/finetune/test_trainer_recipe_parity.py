"""Fine-tuning's optimisation is the transformers recipe, step for step: with dropout off, the same starting weights
and the same batches, `Finetuning` (the shared TrainStep, fused AdamW, the warm-up/decay schedule, clipping) ends
at the weights a plain loop over `transformers`' model, `torch.optim.AdamW` (epsilon 1e-8, no decay on biases and
LayerNorm) and `get_linear_schedule_with_warmup` reaches, for token and sequence classification. What remains
different on purpose is checked too: the warm-up's first step (ours (s + 1) / w, transformers' s / w)."""

from __future__ import annotations

import itertools
import math
import types
from pathlib import Path

import pytest
import torch

from bertforge.finetune import trainer
from bertforge.finetune.config import FinetuneConfig
from bertforge.finetune.features import collate
from bertforge.finetune.tasks import get_task
from bertforge.finetune.trainer import Finetuning
from bertforge.tokenizer import Tokenizer

from .conftest import write_conll, write_sentiment

transformers = pytest.importorskip("transformers")

LR, WEIGHT_DECAY, EPOCHS = 2e-3, 0.01, 2
NO_DROPOUT = {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
HF_CLASSES = {"ner": "BertForTokenClassification", "classification": "BertForSequenceClassification"}


def task_features(task_name: str, tiny_model: Path, tmp_path: Path) -> tuple[list[dict], dict]:
    """The task's training features (targets only) and the config overrides its labels imply."""
    task = get_task(task_name)
    path = write_conll(tmp_path / "train.txt") if task_name == "ner" else write_sentiment(tmp_path / "train.tsv", 20)
    opts = FinetuneConfig(task=task_name, model=str(tiny_model), train=str(path), dev=str(path), out="unused")
    examples, _ = task.read(path, opts, labelled=True)
    overrides = task.label_overrides(examples, path)
    from bertforge import BertConfig

    config = BertConfig.from_pretrained(tiny_model, **overrides)
    encoded = task.encode(Tokenizer.from_pretrained(tiny_model), examples, opts, config, path, labelled=True)
    return [{k: f[k] for k in ("input_ids", "token_type_ids", "labels")} for f in encoded.features], overrides


def uneven_batches(n: int) -> list[list[int]]:
    """Batches of 5, 3, 5, 3, ... examples (the last one what is left): unequal label counts per step, as many
    batches as a batch size of 4 makes (so the schedule `Finetuning` builds for `batch_size=4` fits them)."""
    batches, start, size = [], 0, 5
    while start < n:
        batches.append(list(range(start, min(n, start + size))))
        start, size = start + size, 8 - size
    return batches


def ours_after(task_name, tiny_model, features, overrides, batches, warmup_ratio) -> torch.nn.Module:
    """bertforge's fine-tuning loop over `batches`, EPOCHS times."""
    torch.manual_seed(0)
    model = get_task(task_name).model_class.from_pretrained(tiny_model, quiet=True, **overrides, **NO_DROPOUT)
    cfg = FinetuneConfig(task=task_name, model="m", train="t", dev="d", out="o", epochs=EPOCHS, batch_size=4, lr=LR,
                         warmup_ratio=warmup_ratio, weight_decay=WEIGHT_DECAY, progress=False)

    class FixedBatches(Finetuning):
        def epoch_batches(self) -> list[list[int]]:
            return batches

    scores = itertools.count()  # every evaluation "better": the run ends with its last weights, like the other side
    run = FixedBatches(model, features, lambda: {"f1": next(scores)}, cfg, "f1", False, 0, torch.device("cpu"))
    assert run.total_steps == EPOCHS * len(batches) or len(batches) == 1
    run.bar = types.SimpleNamespace(update=lambda n: None, set_postfix=lambda **k: None)
    run.run()
    return model


def transformers_after(task_name, tiny_model, features, overrides, batches, head, warmup_ratio):
    """The same steps as `Trainer` takes them: per-batch mean loss, clip 1.0, AdamW, linear schedule."""
    model = getattr(transformers, HF_CLASSES[task_name]).from_pretrained(tiny_model, **overrides, **NO_DROPOUT)
    model.load_state_dict(head, strict=False)
    named = list(model.named_parameters())
    no_decay = [p for n, p in named if n.endswith(".bias") or "LayerNorm" in n]
    decay = [p for n, p in named if not (n.endswith(".bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=LR, eps=1e-8)
    total = EPOCHS * len(batches)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, math.ceil(total * warmup_ratio), total)
    model.train()
    norms = []
    for indices in batches * EPOCHS:
        model(**collate([features[i] for i in indices], 0)).loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
    return model, norms


def weight_gap(ours: torch.nn.Module, theirs: torch.nn.Module, start: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(largest difference between the two models' weights, largest distance either moved from `start`)."""
    mine = dict(ours.named_parameters())
    gap = moved = 0.0
    for name, p in theirs.named_parameters():
        gap = max(gap, float((mine[name] - p).detach().abs().max()))
        moved = max(moved, float((p - start[name]).detach().abs().max()))
    return gap, moved


def run_both(task_name, tiny_model, tmp_path, warmup_ratio):
    features, overrides = task_features(task_name, tiny_model, tmp_path)
    batches = uneven_batches(len(features))
    torch.manual_seed(0)
    start_model = get_task(task_name).model_class.from_pretrained(tiny_model, quiet=True, **overrides)
    start = {k: v.detach().clone() for k, v in start_model.named_parameters()}
    head = {k: v for k, v in start.items() if k.startswith(("classifier.", "bert.pooler."))}
    ours = ours_after(task_name, tiny_model, features, overrides, batches, warmup_ratio)
    theirs, norms = transformers_after(task_name, tiny_model, features, overrides, batches, head, warmup_ratio)
    return ours, theirs, start, norms


@pytest.mark.parametrize("task_name", ["ner", "classification"])
def test_fine_tuning_takes_the_transformers_recipe_steps(task_name, tiny_model, tmp_path):
    ours, theirs, start, norms = run_both(task_name, tiny_model, tmp_path, warmup_ratio=0.0)
    if task_name == "ner":
        assert max(norms) > 1.0  # clipping took part (the tiny classifier's gradients stay below 1)
    gap, moved = weight_gap(ours, theirs, start)
    assert moved > 2 * LR  # the weights moved by several steps' worth
    assert gap < 1e-3 * moved, (gap, moved)  # the same trajectory, to float rounding


def schedule_rates(make_schedule, steps: int = 8) -> list[float]:
    """The learning rate of each of `steps` steps under the schedule `make_schedule(optimizer)` (peak 1)."""
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    schedule = make_schedule(optimizer)
    rates = []
    for _ in range(steps):
        rates.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    return rates


def test_the_warmup_differs_only_by_transformers_zero_first_step(tiny_model, tmp_path):
    """transformers' warm-up runs step s at s / w of the peak (step 0 at learning rate 0), ours at (s + 1) / w:
    a deliberate difference (no wasted first step), which this shows to be the only one under warm-up."""
    ours, theirs, start, _ = run_both("ner", tiny_model, tmp_path, warmup_ratio=0.3)
    gap, moved = weight_gap(ours, theirs, start)
    assert gap > 1e-2 * moved  # visibly different trajectories ...
    rates = schedule_rates(lambda optimizer: trainer.warmup_decay(optimizer, 4, 8))
    theirs_rates = schedule_rates(lambda optimizer: transformers.get_linear_schedule_with_warmup(optimizer, 4, 8))
    assert rates[:4] == [0.25, 0.5, 0.75, 1.0] and theirs_rates[:4] == [0.0, 0.25, 0.5, 0.75]  # ... from the warm-up
    assert rates[4:] == pytest.approx(theirs_rates[4:])  # the same linear decay to 0 after it


def test_the_optimizer_is_transformers_adamw(tiny_model, tmp_path, monkeypatch):
    """Epsilon 1e-8 and betas (0.9, 0.999) as Trainer's defaults; weight decay on exactly the parameters
    transformers decays (everything but biases and LayerNorm weights), the new head included."""
    built = []
    real = trainer.make_optimizer
    monkeypatch.setattr(trainer, "make_optimizer", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    features, overrides = task_features("ner", tiny_model, tmp_path)
    model = ours_after("ner", tiny_model, features, overrides, uneven_batches(len(features))[:1], 0.0)
    (optimizer,) = built
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = set()
    for group in optimizer.param_groups:
        assert group["eps"] == 1e-8 and group["betas"] == (0.9, 0.999)
        if group["weight_decay"]:
            assert group["weight_decay"] == WEIGHT_DECAY
            decayed |= {names[id(p)] for p in group["params"]}
    expected = {n for n in names.values() if not (n.endswith(".bias") or "LayerNorm" in n)}
    assert decayed == expected and "classifier.weight" in decayed
