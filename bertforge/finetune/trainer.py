"""The fine-tuning loop: the shared `bertforge.training.step.TrainStep` (AdamW, warm-up and decay, clipping, non-finite
steps skipped) with periodic evaluation, best-checkpoint keeping and early stopping; plus batched inference and
the training-curve plot.

Runs at `--precision` (auto: fp32 on the CPU, bf16 autocast on CUDA; fp16 adds loss scaling), its training steps
compiled with `--compile`. Every random choice (head initialisation, dropout, batch order) comes from the run's
seed, so a run repeats exactly on the same machine and thread count. With checkpoints
(`Finetuning.enable_checkpoints`, through the one `training_checkpoint.TrainingCheckpoints`) a run killed at any
moment resumes exactly: the data position (epoch, optimizer steps into its shuffled order, the generator that
shuffles), the dropout RNGs and the evaluation record (the best weights, the evaluations without improvement) are
all in the checkpoint, so the resumed run ends with the weights and the metrics rows of one never interrupted.
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

from .features import Feature, collate, feature_length, inference_batches, training_batches
from ..training.adapters import attach
from ..training.optim import make_optimizer, warmup_decay
from ..core.state import check_same_files, files_fingerprint
from ..training.checkpoint import Loaded, TrainingCheckpoints, number_list
from ..training.time_budget import RunLength
from ..training.log import MetricsLog, Panel, plot_curves
from ..training.step import TrainStep, autocast as train_autocast, choose_precision, labelled_count, pick_precision
from ..training.loop import Cadence, RunLifecycle, TrainLoop, progress_bar
from ..training.parallel import wrap_model
from ..core.system import Runtime

# Former names of `bertforge.training.optim`'s functions, kept so that existing imports work: the same objects, not copies.
# `linear_schedule(optimizer, warmup_steps, total_steps)` is `warmup_decay`, whose warm-up is (step + 1) / warmup.
linear_schedule = warmup_decay

log = logging.getLogger("bertforge")

# Gradient-norm clipping threshold, as in BERT's original recipe.
MAX_GRAD_NORM = 1.0
FINETUNE_EPS = 1e-8  # AdamW epsilon of fine-tuning recipes (transformers' default); pretraining keeps BERT's 1e-6
#: A run of fewer optimizer steps than this is warned about at its start: in so few the model barely moves from where
#: it starts (README's quick start on 16 rows in one batch for 3 epochs took 3 steps and stayed at chance), and the
#: warm-up and decay span next to nothing.
FEW_STEPS = 10


def autocast(device: torch.device, precision: str = "auto") -> contextlib.AbstractContextManager[Any]:
    """Evaluation and prediction's precision: auto is bf16 autocast on CUDA (where the GPU has bf16) and nothing
    (fp32) elsewhere; bf16 or fp16 autocast where asked for."""
    return train_autocast(device, pick_precision(precision, device, training=False))


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
    precision: str = "auto",
) -> tuple[list[dict[str, np.ndarray]], float | None]:
    """The model's outputs for every feature (logits, or start/end logits), in the order of `features`, each cut
    to the feature's length; and the mean loss when the features carry targets."""
    was_training = model.training
    model.eval()
    outputs: list[dict[str, np.ndarray] | None] = [None] * len(features)
    loss_sum, counted = 0.0, 0
    batches = inference_batches([feature_length(f) for f in features], batch_size)
    for indices in tqdm(batches, desc=description, leave=False, disable=_disable(progress)):
        batch = move(collate([features[i] for i in indices], pad_token_id), device)
        with autocast(device, precision):
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


def run_logged(run: Finetuning, metrics: MetricsLog, description: str,
               lifecycle: RunLifecycle | None = None) -> TrainResult:
    """`run.run()` with its records written to `metrics` (closed at the end) and a progress bar of its steps;
    `lifecycle` (the run directory's) learns of every checkpoint."""
    disable = _disable(run.cfg.progress) if run.rt.is_main else True  # under torchrun, rank 0's bar alone
    with metrics, progress_bar(run.total_steps, run.stepper.step, description, disable, redirect_logging=True) as bar:
        run.record, run.bar, run.lifecycle = metrics.write, bar, lifecycle
        return run.run()


def finetuning_counts(batch: dict[str, torch.Tensor]) -> dict[str, int]:
    """What a fine-tuning step's loss is normalised by: labelled tokens (NER), label elements (classification,
    regression, multi-label) or questions (QA, one start and one end each)."""
    if "labels" in batch:
        return {"loss": labelled_count(batch["labels"])}
    return {"loss": batch["start_positions"].numel()}


def rank_share(indices: list[int], rt: Runtime) -> tuple[list[int], bool]:
    """This rank's share of a global batch (every `world_size`-th example from its rank on), and whether it holds
    any: a rank left with none (a last batch smaller than the world) gets the batch's first example as a stand-in
    whose loss counts no target (`TrainStep.accumulate` gives it zero gradients)."""
    share = indices[rt.rank :: rt.world_size]
    return (share, True) if share else (indices[:1], False)


class Finetuning:
    """The state of one fine-tuning run: the shared `TrainStep` plus batching by epoch, evaluation, best-weights
    keeping and early stopping; `run_logged` runs it with a progress bar. Another trainer (sentence embeddings)
    subclasses it with its own `epoch_batches`, `make_batch`, `forward_backward` and `counts`."""

    wraps_own_module = False  # True: the subclass wraps (DDP) the module its steps call itself

    def __init__(self, model, train_features, evaluate, cfg, main_metric, lower_is_better, pad_token_id, device,
                 rt: Runtime | None = None) -> None:
        self.model, self.features, self.evaluate, self.cfg = model, train_features, evaluate, cfg
        # under torchrun (`rt`): every rank trains on its share of each global batch of `cfg.batch_size`
        self.rt = rt if rt is not None else Runtime(0, 1, 0, device)
        model.to(device)  # before the optimizer takes its parameters and DDP wraps it
        self.main_metric, self.lower_is_better, self.pad_token_id, self.device = main_metric, lower_is_better, pad_token_id, device
        self.generator = torch.Generator().manual_seed(cfg.seed)
        epoch_steps = self.plan_steps()
        self.total_steps = sum(epoch_steps)
        warmup_steps = math.ceil(self.total_steps * cfg.warmup_ratio)
        if cfg.freeze_backbone:
            freeze_backbone(model)  # before the optimizer, which then leaves the frozen weights out
        attach(model, cfg)  # low-rank adapters (--lora-rank): the encoder frozen, the optimizer theirs and the head's
        optimizer = make_optimizer(model, "adamw", cfg.lr, cfg.weight_decay, eps=FINETUNE_EPS,
                                   layer_lr_decay=cfg.layer_lr_decay)
        scheduler = warmup_decay(optimizer, warmup_steps, self.total_steps)
        precision = choose_precision(cfg.precision, device)
        self.stepper = TrainStep(model, optimizer, scheduler, max_grad_norm=MAX_GRAD_NORM, device=device,
                                 precision=precision.dtype, world_size=self.rt.world_size,
                                 max_skipped_steps=cfg.max_skipped_steps)
        # what training steps call: DDP under torchrun, compiled with --compile (a subclass that trains through a
        # module of its own, `wraps_own_module`, wraps that one instead)
        self.train_model = model if self.wraps_own_module else wrap_model(model, self.rt, compile=cfg.compile)
        self.stand_ins: list[Any] = []  # this step's micro-batches that stand in for a share with no example
        per_epoch = (f"{epoch_steps[0]} step(s)" if len(set(epoch_steps)) == 1
                     else f"{min(epoch_steps)}-{max(epoch_steps)} step(s), {self.total_steps} in all")
        if self.rt.is_main:
            processes = f" split over {self.rt.world_size} processes" if self.rt.distributed else ""
            log.info("%s on %d %s: %d epoch(s) x %s, batch %d x %d accumulated%s, warm-up %d step(s), on %s at %s (%s)",
                     self.what, len(train_features), self.rows, cfg.epochs, per_epoch, cfg.batch_size, cfg.grad_accum,
                     processes, warmup_steps, device, precision.name, precision.reason)
            self.warn_few_steps()
        self.result = TrainResult()
        self.best_state: dict[str, torch.Tensor] | None = None
        self.since_best = 0
        self.record: Callable[[dict[str, Any]], Any] = lambda entry: None
        self.bar: Any = None
        self.lifecycle: RunLifecycle | None = None
        # the data position: the epoch, the optimizer steps taken in it, and the generator's state before it drew
        # the epoch's batches; the training losses since the last logged row
        self.epoch, self.position = 0, 0
        self.epoch_start = self.generator.get_state()
        self.groups: list[list[list[int]]] | None = None  # the epoch's steps (batches of indices), once drawn
        self.batch_count = 0  # the epoch's batches
        self.last_lr = 0.0
        self.losses: list[float] = []
        self.checkpoints: TrainingCheckpoints | None = None  # see `enable_checkpoints`
        self.save_every = 0

    what, rows = "fine-tuning", "features"  # the plan line's words

    def warn_few_steps(self) -> None:
        """One warning line when the whole run is under `FEW_STEPS` optimizer steps, with its numbers and the
        options that give it more."""
        steps, cfg = self.total_steps, self.cfg
        if steps >= FEW_STEPS:
            return
        accumulated = cfg.grad_accum > 1
        batch = f"batch {cfg.batch_size}" + (f" x {cfg.grad_accum} accumulated" if accumulated else "")
        smaller = "a smaller --batch-size" + (" or --grad-accum" if accumulated else "")
        log.warning("%s: only %d optimizer step%s (%d %s, %s, %d epoch%s): the model will barely move from where it "
                    "starts; use more rows, %s, or more --epochs", self.what, steps, "" if steps == 1 else "s",
                    len(self.features), self.rows, batch, cfg.epochs, "" if cfg.epochs == 1 else "s", smaller)

    def plan_steps(self) -> list[int]:
        """The optimizer steps of each epoch (what the schedule spans), known before the run starts."""
        batches = math.ceil(len(self.features) / self.cfg.batch_size)
        return [math.ceil(batches / self.cfg.grad_accum)] * self.cfg.epochs

    def epoch_batches(self) -> list[list[int]]:
        """One epoch's batches of example indices, in the order of the run's generator."""
        lengths = [feature_length(f) for f in self.features]
        return training_batches(lengths, self.cfg.batch_size, self.generator, self.cfg.group_by_length)

    def make_batch(self, indices: list[int]) -> Any:
        """The micro-batch `forward_backward` takes: this rank's share of these examples (`rank_share`)."""
        share, real = rank_share(indices, self.rt)
        batch = collate([self.features[i] for i in share], self.pad_token_id)
        if not real:
            self.stand_ins.append(batch)
        return batch

    def counts(self, batch: Any) -> dict[str, int]:
        """What a micro-batch's loss is normalised by (see `TrainStep`): nothing for a stand-in."""
        own = finetuning_counts(batch)
        return dict.fromkeys(own, 0) if any(batch is s for s in self.stand_ins) else own

    def forward_backward(self, batch: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
        with self.stepper.autocast():
            loss = self.train_model(**move(batch, self.device)).loss
        return {"loss": self.stepper.accumulate({"loss": loss}, weights)}

    def train_mode(self) -> None:
        """Training mode, except a frozen backbone: it stays in eval mode (no dropout in fixed features)."""
        self.model.train()
        if self.cfg.freeze_backbone:
            backbone = self.model.base_model
            backbone.embeddings.eval()
            backbone.encoder.eval()

    def run(self) -> TrainResult:
        """Train every epoch (from where a resumed run left off) on the shared loop; the best weights at the end."""
        started = time.perf_counter()
        self.model.to(self.device)
        self.train_mode()
        cadence = Cadence(self.cfg.log_every, self.cfg.eval_every, self.save_every)
        TrainLoop(self, cadence, RunLength(self.total_steps), self.record, self.bar, lifecycle=self.lifecycle,
                  rt=self.rt).run()
        self.result.steps = self.stepper.step
        self.result.skipped_steps = self.stepper.skipped_steps
        self.result.seconds = time.perf_counter() - started
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        return self.result

    # ------------------------------------------------------------------ what the loop asks (`train_loop.LoopTrainer`)
    @property
    def step(self) -> int:
        return self.stepper.step

    def finished(self) -> bool:
        return self.epoch >= self.cfg.epochs or self.result.stopped_early

    def train_step(self) -> Any:
        """The next optimizer step of the epoch: `grad_accum` batches (the epoch's last step may take fewer), the
        epoch's batches drawn at its first step (its generator state kept: a resumed run draws them again)."""
        if self.groups is None:
            self.epoch_start = self.generator.get_state()
            batches = self.epoch_batches()
            ga = self.cfg.grad_accum
            self.batch_count, self.groups = len(batches), [batches[i : i + ga] for i in range(0, len(batches), ga)]
        self.stand_ins = []
        micro = [self.make_batch(indices) for indices in self.groups[self.position]]
        outcome = self.stepper.run(micro, self.forward_backward, self.counts, self.train_model)
        self.position += 1
        return outcome

    def record_step(self, outcome: Any) -> None:
        self.losses.append(outcome.totals["loss"].item())
        self.last_lr = outcome.lr

    def period_ends(self) -> bool:
        return self.groups is not None and self.position == len(self.groups)

    def done(self) -> float:
        """The epochs done, as a fraction (the batches of this epoch taken)."""
        return self.epoch + min(self.batch_count, self.position * self.cfg.grad_accum) / self.batch_count

    def log_row(self, on_grid: bool, seconds: float) -> dict[str, Any]:
        mean_loss = sum(self.losses) / len(self.losses)
        self.losses = []
        return {"type": "train", "step": self.stepper.step, "epoch": round(self.done(), 4), "loss": mean_loss,
                "lr": self.last_lr, "skipped_steps": self.stepper.skipped_steps}

    @staticmethod
    def progress(row: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{row['loss']:.4f}"}

    def evaluate_now(self, period_end: bool) -> bool:
        """Every epoch ends with an evaluation; one inside it (--eval-every) that says stop ends the run there."""
        stop = self.run_evaluation(self.epoch + 1 if period_end else self.done())
        if stop and not period_end:
            self.result.stopped_early = True
        return stop

    def end_period(self, stop: bool) -> None:
        """The epoch's end, after its evaluation: stopping before the last epoch is early; the next epoch starts."""
        self.result.stopped_early = stop and self.epoch + 1 < self.cfg.epochs
        self.epoch, self.position, self.epoch_start = self.epoch + 1, 0, self.generator.get_state()
        self.groups = None

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
        if self.rt.is_main:
            log.info("step %d (epoch %g): dev %s = %.4f%s", step, entry.epoch, self.main_metric, value,
                     " (best)" if better else "")
        return self.cfg.early_stop_patience is not None and self.since_best >= self.cfg.early_stop_patience

    # ------------------------------------------------------------------ checkpoints
    def enable_checkpoints(self, checkpoints: TrainingCheckpoints, save_every: int = 0) -> None:
        """Save a checkpoint at each epoch's end, where early stopping ends the run and (`save_every` > 0) every
        `save_every` optimizer steps; `resume()` continues from the newest one."""
        self.checkpoints, self.save_every = checkpoints, save_every
        # the files the run reads, as they are now: a checkpoint records them, a resume refuses other ones
        self.data_files = files_fingerprint([f for f in (self.cfg.train, self.cfg.dev) if f], digest=True)  # dev: optional for embeddings

    def save_checkpoint(self) -> None:
        """The run as it stands (nothing without checkpoints): the data position, the losses not logged yet, the
        evaluation record; the best weights too unless they are the current ones (the best evaluation was at this
        step)."""
        if self.checkpoints is None:
            return
        best, step = self.result.best, self.stepper.step
        evaluations = [[e.step, e.epoch, e.metrics] for e in self.result.evaluations]
        record = {"evaluations": evaluations, "best": None if best is None else self.result.evaluations.index(best),
                  "best_weights": self.best_state if best is not None and best.step != step else None}
        data = {"epoch": self.epoch, "position": self.position, "generator": self.epoch_start, "files": self.data_files}
        counters = {"losses": self.losses, "since_best": self.since_best, "stopped_early": self.result.stopped_early,
                    **self.own_counters()}
        self.checkpoints.save(data, counters, {"evaluation": record})

    def snapshot(self) -> None:
        """Mid-run, when a signal stops the run: its checkpoint is all there is (the model a run writes is its best
        evaluated weights, known at the end); say where it is."""
        if self.checkpoints is not None and self.rt.is_main:
            log.info("the checkpoint at step %d is in %s: the same command with --resume continues", self.step,
                     self.checkpoints.out)

    def own_counters(self) -> dict[str, Any]:
        """A subclass's JSON values for the checkpoint (read back by its `restore`)."""
        return {}

    def restore(self, loaded: Loaded) -> None:
        """This trainer's part of a checkpoint being read (see `save_checkpoint`), checked."""
        data, trainer = loaded.data, loaded.trainer
        if not (isinstance(data, dict) and all(type(data.get(k)) is int and data[k] >= 0 for k in ("epoch", "position"))
                and isinstance(data.get("generator"), torch.Tensor)):
            raise ValueError(f"{loaded.path}: the data position is not an epoch, a step and a generator state")
        if "files" in data:  # (checkpoints of earlier versions did not record them)
            check_same_files(data["files"], self.data_files, "training or dev data (--train, --dev)")
        if not (number_list(trainer.get("losses")) and type(trainer.get("since_best")) is int
                and isinstance(trainer.get("stopped_early"), bool)):
            raise ValueError(f"{loaded.path}: expected losses, since_best and stopped_early in trainer_state.json")
        record = loaded.state("evaluation")
        evaluations = [Evaluation(step, epoch, metrics) for step, epoch, metrics in record["evaluations"]]
        best = None if record["best"] is None else evaluations[record["best"]]
        self.best_state = None
        if best is not None:
            weights = record["best_weights"] if record["best_weights"] is not None else loaded.weights
            self.best_state = {k: weights[k].clone() for k in self.model.state_dict()}
        self.generator.set_state(data["generator"])
        self.epoch, self.position, self.epoch_start = data["epoch"], data["position"], data["generator"]
        self.losses, self.since_best = trainer["losses"], trainer["since_best"]
        self.result.evaluations, self.result.best = evaluations, best
        self.result.stopped_early = trainer["stopped_early"]

    def resume(self) -> bool:
        """Continue from the newest checkpoint that loads (`TrainingCheckpoints.resume`); False when there is none
        yet (the run starts from step 0)."""
        return self.checkpoints is not None and self.checkpoints.resume(self.restore) is not None


def freeze_backbone(model: torch.nn.Module) -> None:
    """`--freeze-backbone`: the embeddings and the encoder get requires_grad False, so that only the task head
    trains. The pooler (BERT's, ALBERT's) counts as the head: it is the first layer of the sequence head, and a
    checkpoint pre-trained without it (MLM only) has a freshly initialised one that must learn."""
    backbone: Any = model.base_model  # its BertModel
    for module in (backbone.embeddings, backbone.encoder):
        module.requires_grad_(False)


def plot_curve(records: Iterator[dict[str, Any]] | Sequence[dict[str, Any]], main_metric: str, target: Path) -> None:
    """Training loss, the dev main metric and the learning rate against the optimizer step, as a PNG."""
    panels = (Panel("training loss", ("loss",), kind="train"), Panel(f"dev {main_metric}", (main_metric,), kind="eval", marker="o"),
              Panel("learning rate", ("lr",), kind="train"))
    plot_curves(records, target, panels, title="fine-tuning")
