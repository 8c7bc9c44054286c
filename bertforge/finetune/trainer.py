"""The fine-tuning loop: the shared `bertforge.train.TrainStep` (AdamW, warm-up and decay, clipping, non-finite
steps skipped) with periodic evaluation, best-checkpoint keeping and early stopping; plus batched inference and
the training-curve plot.

Runs in fp32 on the CPU and under bf16 autocast on CUDA. Every random choice (head initialisation, dropout, batch
order) comes from the run's seed, so a run repeats exactly on the same machine and thread count.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from .config import FinetuneConfig
from .features import Feature, collate, inference_batches, training_batches
from ..optim import make_optimizer, parameter_groups, warmup_decay  # noqa: F401  (parameter_groups: importable here too)
from ..training_log import MetricsLog, Panel, plot_curves
from ..train import TrainStep, autocast as train_autocast, labelled_count, pick_precision

# Former names of `bertforge.optim`'s functions, kept so that existing imports work: the same objects, not copies.
# `linear_schedule(optimizer, warmup_steps, total_steps)` is `warmup_decay`, whose warm-up is (step + 1) / warmup.
linear_schedule = warmup_decay

log = logging.getLogger("bertforge")

# Gradient-norm clipping threshold, as in BERT's original recipe.
MAX_GRAD_NORM = 1.0
FINETUNE_EPS = 1e-8  # AdamW epsilon of fine-tuning recipes (transformers' default); pretraining keeps BERT's 1e-6


def autocast(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast on CUDA (where the GPU has bf16); nothing (fp32) elsewhere: training's "auto" precision."""
    return train_autocast(device, pick_precision("auto", device))


def move(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def run_model(
    model: torch.nn.Module,
    features: Sequence[Feature],
    batch_size: int,
    pad_token_id: int,
    device: torch.device,
    progress: bool | None = None,
    description: str = "evaluating",
) -> tuple[list[dict[str, np.ndarray]], float | None]:
    """The model's outputs for every feature (logits, or start/end logits), in the order of `features`, each cut
    to the feature's length; and the mean loss when the features carry targets."""
    was_training = model.training
    model.eval()
    outputs: list[dict[str, np.ndarray] | None] = [None] * len(features)
    loss_sum, counted = 0.0, 0
    batches = inference_batches([len(f["input_ids"]) for f in features], batch_size)
    for indices in tqdm(batches, desc=description, leave=False, disable=_disable(progress)):
        batch = move(collate([features[i] for i in indices], pad_token_id), device)
        with autocast(device):
            out = model(**batch)
        if out.loss is not None:
            loss_sum += out.loss.item() * len(indices)
            counted += len(indices)
        names = [k for k in ("logits", "start_logits", "end_logits") if getattr(out, k, None) is not None]
        arrays = {k: getattr(out, k).float().cpu().numpy() for k in names}  # [B, L], [B, S, L] or [B, S]
        for row, i in enumerate(indices):
            n = len(features[i]["input_ids"])
            outputs[i] = {k: (v[row] if k == "logits" and v.ndim == 2 else v[row, :n]) for k, v in arrays.items()}
    model.train(was_training)
    return outputs, (loss_sum / counted if counted else None)  # type: ignore[return-value]


def _disable(progress: bool | None) -> bool | None:
    """tqdm's `disable`: None lets tqdm hide the bar when stderr is not a terminal."""
    return None if progress is None else not progress


@dataclass
class Evaluation:
    step: int
    epoch: float
    metrics: dict[str, Any]


@dataclass
class TrainResult:
    best: Evaluation | None = None
    evaluations: list[Evaluation] = field(default_factory=list)
    steps: int = 0
    skipped_steps: int = 0  # steps whose loss or gradient was not finite: no update
    seconds: float = 0.0
    stopped_early: bool = False


def train(
    model: torch.nn.Module,
    train_features: Sequence[Feature],
    evaluate: Callable[[], dict[str, Any]],
    cfg: FinetuneConfig,
    main_metric: str,
    lower_is_better: bool,
    pad_token_id: int,
    device: torch.device,
    metrics_file: Path,
) -> TrainResult:
    """Fine-tune `model` in place; on return it holds the weights of the best evaluation.

    `evaluate()` scores the model on the dev set (a dict with `main_metric`). It runs at the end of each epoch
    and every `cfg.eval_every` optimizer steps; training stops after `cfg.early_stop` evaluations in a row
    without a better score. Training-loss records (every `cfg.log_every` steps and at each epoch's end) and
    evaluations are appended to `metrics_file`, one JSON object a line.
    """
    run = Finetuning(model, train_features, evaluate, cfg, main_metric, lower_is_better, pad_token_id, device)
    return run_logged(run, MetricsLog(metrics_file), "fine-tuning")


def run_logged(run: Finetuning, metrics: MetricsLog, description: str) -> TrainResult:
    """`run.run()` with its records written to `metrics` (closed at the end) and a progress bar of its steps."""
    with metrics, logging_redirect_tqdm(), tqdm(
        total=run.total_steps, desc=description, unit="step", disable=_disable(run.cfg.progress)
    ) as bar:
        run.record, run.bar = metrics.write, bar
        return run.run()


def finetuning_counts(batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """What a fine-tuning step's loss is normalised by: labelled tokens (NER), label elements (classification,
    regression, multi-label) or questions (QA, one start and one end each)."""
    if "labels" in batch:
        return {"loss": labelled_count(batch["labels"])}
    return {"loss": batch["start_positions"].numel()}


class Finetuning:
    """The state of one fine-tuning run: the shared `TrainStep` plus batching by epoch, evaluation, best-weights
    keeping and early stopping. `train()` is its entry point. Another trainer (sentence embeddings) subclasses it
    with its own `epoch_batches`, `make_batch`, `forward_backward` and `counts`."""

    def __init__(self, model, train_features, evaluate, cfg, main_metric, lower_is_better, pad_token_id, device) -> None:
        self.model, self.features, self.evaluate, self.cfg = model, train_features, evaluate, cfg
        self.main_metric, self.lower_is_better, self.pad_token_id, self.device = main_metric, lower_is_better, pad_token_id, device
        self.generator = torch.Generator().manual_seed(cfg.seed)
        batches_per_epoch = math.ceil(len(train_features) / cfg.batch_size)
        steps_per_epoch = math.ceil(batches_per_epoch / cfg.grad_accum)
        self.total_steps = steps_per_epoch * cfg.epochs
        warmup_steps = math.ceil(self.total_steps * cfg.warmup_ratio)
        if cfg.freeze_backbone:
            freeze_backbone(model)  # before the optimizer, which then leaves the frozen weights out
        optimizer = make_optimizer(model, "adamw", cfg.lr, cfg.weight_decay, eps=FINETUNE_EPS,
                                   layer_lr_decay=cfg.layer_lr_decay)
        scheduler = warmup_decay(optimizer, warmup_steps, self.total_steps)
        self.stepper = TrainStep(model, optimizer, scheduler, max_grad_norm=MAX_GRAD_NORM, device=device,
                                 precision=pick_precision("auto", device), max_skipped_steps=cfg.max_skipped_steps)
        log.info(
            "fine-tuning on %d features: %d epoch(s) x %d step(s), batch %d x %d accumulated, warm-up %d step(s), on %s",
            len(train_features), cfg.epochs, steps_per_epoch, cfg.batch_size, cfg.grad_accum, warmup_steps, device,
        )
        self.result = TrainResult()
        self.best_state: dict[str, torch.Tensor] | None = None
        self.since_best = 0
        self.record: Callable[[dict[str, Any]], Any] = lambda entry: None
        self.bar: Any = None

    def epoch_batches(self) -> list[list[int]]:
        """One epoch's batches of example indices, in the order of the run's generator."""
        lengths = [len(f["input_ids"]) for f in self.features]
        return training_batches(lengths, self.cfg.batch_size, self.generator, self.cfg.group_by_length)

    def make_batch(self, indices: list[int]) -> Any:
        """The micro-batch `forward_backward` takes, for these examples."""
        return collate([self.features[i] for i in indices], self.pad_token_id)

    def counts(self, batch: Any) -> dict[str, int]:
        """What a micro-batch's loss is normalised by (see `TrainStep`)."""
        return finetuning_counts(batch)

    def forward_backward(self, batch: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
        with self.stepper.autocast():
            loss = self.model(**move(batch, self.device)).loss
        return {"loss": self.stepper.accumulate({"loss": loss}, weights)}

    def train_mode(self) -> None:
        """Training mode, except a frozen backbone: it stays in eval mode (no dropout in fixed features)."""
        self.model.train()
        if self.cfg.freeze_backbone:
            backbone = self.model.base_model
            backbone.embeddings.eval()
            backbone.encoder.eval()

    def run(self) -> TrainResult:
        started = time.perf_counter()
        self.model.to(self.device)
        self.train_mode()
        for epoch in range(self.cfg.epochs):
            if self.train_epoch(epoch):
                self.result.stopped_early = True
                break
            if self.run_evaluation(epoch + 1):  # every epoch ends with an evaluation
                self.result.stopped_early = epoch + 1 < self.cfg.epochs
                break
        self.result.steps = self.stepper.step
        self.result.skipped_steps = self.stepper.skipped_steps
        self.result.seconds = time.perf_counter() - started
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        return self.result

    def train_epoch(self, epoch: int) -> bool:
        """One pass over the data, `grad_accum` batches a step (the last step may take fewer). True: stop early."""
        cfg = self.cfg
        batches = self.epoch_batches()
        groups = [batches[i : i + cfg.grad_accum] for i in range(0, len(batches), cfg.grad_accum)]
        losses: list[float] = []
        for g, group in enumerate(groups):
            micro = [self.make_batch(indices) for indices in group]
            outcome = self.stepper.run(micro, self.forward_backward, self.counts)
            losses.append(outcome.totals["loss"].item())
            step, last = self.stepper.step, g + 1 == len(groups)
            done = epoch + min(len(batches), (g + 1) * cfg.grad_accum) / len(batches)
            self.bar.update(1)
            if step % cfg.log_every == 0 or last:
                mean_loss = sum(losses) / len(losses)
                self.bar.set_postfix(loss=f"{mean_loss:.4f}")
                self.record({"type": "train", "step": step, "epoch": round(done, 4), "loss": mean_loss,
                             "lr": outcome.lr, "skipped_steps": self.stepper.skipped_steps})
                losses = []
            if cfg.eval_every and step % cfg.eval_every == 0 and not last and self.run_evaluation(done):
                return True
        return False

    def run_evaluation(self, epoch: float) -> bool:
        """Score the model; keep it if best. True when early stopping says to stop."""
        metrics = self.evaluate()
        self.train_mode()  # evaluation put the whole model back in training mode
        step, best = self.stepper.step, self.result.best
        entry = Evaluation(step, round(epoch, 4), metrics)
        self.result.evaluations.append(entry)
        self.record({"type": "eval", "step": step, "epoch": entry.epoch, **metrics})
        value = metrics[self.main_metric]
        better = best is None or (
            value < best.metrics[self.main_metric] if self.lower_is_better else value > best.metrics[self.main_metric]
        )
        if better:
            self.result.best = entry
            self.best_state = {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            self.since_best = 0
        else:
            self.since_best += 1
        log.info("step %d (epoch %g): dev %s = %.4f%s", step, entry.epoch, self.main_metric, value, " (best)" if better else "")
        return self.cfg.early_stop is not None and self.since_best >= self.cfg.early_stop


def freeze_backbone(model: torch.nn.Module) -> None:
    """`--freeze-backbone`: the embeddings and the encoder get requires_grad False, so that only the task head
    trains. The pooler (BERT's, ALBERT's) counts as the head: it is the first layer of the sequence head, and a
    checkpoint pre-trained without it (MLM only) has a freshly initialised one that must learn."""
    backbone = model.base_model
    for module in (backbone.embeddings, backbone.encoder):
        module.requires_grad_(False)


def plot_curve(records: Iterator[dict[str, Any]] | Sequence[dict[str, Any]], main_metric: str, target: Path) -> None:
    """Training loss, the dev main metric and the learning rate against the optimizer step, as a PNG."""
    panels = (Panel("training loss", ("loss",), kind="train"), Panel(f"dev {main_metric}", (main_metric,), kind="eval", marker="o"),
              Panel("learning rate", ("lr",), kind="train"))
    plot_curves(records, target, panels, title="fine-tuning")
