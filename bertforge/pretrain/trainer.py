"""Pretraining: raw text in, a Hugging Face-ready BERT out, exact to resume, from one CPU to many GPUs.

    pretrain(PretrainArgs(corpus=["wiki/"], config="base", max_steps=100_000, out="runs/base"))

One process per device under `torchrun`; PyTorch's own DDP (or FSDP with `fsdp=True`) does the rest. Rank 0 alone
logs and writes. A checkpoint is a directory `OUT/checkpoints/step-N/` built under a temporary name and renamed into
place, so a kill at any moment leaves only complete checkpoints; `resume=True` continues from the newest one that
loads, and the run ends bitwise equal to one that was never interrupted.

The run's parts live beside this module: its settings (`args`), its model config, tokenizer and stream (`build`),
its data (`data`), its objective (`objectives`: the registry entry the settings name, `registry.OBJECTIVES`, which
builds the model it trains), its held-out evaluation (`eval`) and its report (`report`); the loop is every
trainer's (`training.loop`).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ..data.demo_world import DEMO_CORPUS
from ..core.errors import BertforgeError
from ..core.hub import pin_revision
from ..core.state import DataChanged
from ..core.io import atomic_directory
from ..model.card import ModelCard
from ..model.config import BertConfig
from ..model.families import tokenizer_kind as family_tokenizer_kind
from ..training.optim import make_optimizer, warmup_decay
from .args import PRETRAINING, PretrainArgs, run_settings
from .eval import HeldOutEvaluation, build_eval_set
from .build import build_stream, check_fits, choose_tokenizer, run_model_config
from ..training.parallel import wrap_model
from .objectives import network_dir
from .report import metrics_summary, plot_metrics, show_predictions
from ..training.run_dir import RunDirectory, list_checkpoints
from ..core.system import barrier, setup_runtime, teardown_runtime
from ..training.time_budget import RunClock, RunLength
from ..training.step import TrainStep, choose_precision, refuse_nonfinite
from ..training.loop import Cadence, RunLifecycle, TrainLoop, open_metrics, progress_bar
from ..training.checkpoint import Loaded, TrainingCheckpoints, number_list

log = logging.getLogger("bertforge")


class Pretrainer:
    """One pretraining run: its model, optimizer, schedule, data stream and objective, on the shared loop
    (`training.loop.TrainLoop`). `run()` trains to the run's length. The model and the objective are those of the
    objective's registry entry (`args.objective_kind`: `registry.OBJECTIVES`, or distillation's, which
    `DistillArgs` names), built together; the memory check, the data and the exports follow the same entry."""

    def __init__(self, args: PretrainArgs) -> None:
        args.validate()
        # a Hub id is recorded pinned to the commit it resolves to now: a resume or replay loads the same weights
        pinned: dict[str, Any] = {k: pin_revision(v) for k in ("init_from", "teacher")
                                  if isinstance(v := getattr(args, k, None), str)}
        self.args = args = dataclasses.replace(args, **pinned)
        self.rt = setup_runtime(args.device)
        self.out = Path(args.out)
        self.corpus = [str(p) for p in args.corpus] or [str(DEMO_CORPUS)]
        run_dir = RunDirectory(self.out, args.resume, args.overwrite, dataclasses.asdict(args), PRETRAINING)
        self.lifecycle = RunLifecycle(run_dir, self.rt)  # rank 0 acts on OUT
        base_config = args.model_config()  # settings the model config refuses fail here, before anything is written
        self.args = args = args.for_family(base_config)  # the family's recipe where the settings say "auto"
        self.kind = args.objective_kind  # what the run learns: its model, objective, memory and data
        precision = choose_precision(self.args.precision, self.rt.device)
        self.autocast_dtype = precision.dtype
        if self.rt.is_main:
            log.info("precision: %s (%s)", precision.name, precision.reason)
        try:
            self.setup(base_config)
        except BaseException:
            self.abandon()
            raise

    def setup(self, base_config: BertConfig) -> None:
        """Lock OUT and check the whole run (OUT, corpus, tokenizer, model size) before OUT changes; then prepare
        OUT and build the model, optimizer and data."""
        args = self.args
        self.lifecycle.lock()
        self.tokenizer, trained = choose_tokenizer(args, self.out, self.corpus, self.rt,
                                                  family_tokenizer_kind(args.config, base_config.family))
        sized = run_model_config(base_config, self.tokenizer, args)
        check_fits(self.kind.memory_config(sized, args), args, self.rt)
        self.lifecycle.prepare()  # the first change to OUT
        if trained:
            if self.rt.is_main:
                self.tokenizer.save_pretrained(self.out / "tokenizer")
            barrier(self.rt)
            from ..tokenizer import Tokenizer

            self.tokenizer = Tokenizer.from_pretrained(self.out / "tokenizer")  # every rank reads what rank 0 saved
        self.config = run_model_config(base_config, self.tokenizer, args)  # the vocabulary the model is trained with
        # the exported tokenizer's limit is the model's (8,192 after ModernBERT's context extension, not 512)
        self.tokenizer.model_max_length = self.config.max_sequence_length
        resuming = args.resume and bool(list_checkpoints(self.out))  # then resume() brings the weights
        model, self.objective = self.kind.build(self.config, args, resuming, self.rt)
        self.model = model.to(self.rt.device)
        if args.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()  # type: ignore[operator]  # one network's, or RTD's pair's
        self.train_model = wrap_model(self.model, self.rt, args.fsdp, args.compile)
        self.optimizer = make_optimizer(self.model, args.optimizer, args.lr, args.weight_decay,  # fused where it applies
                                        betas=(0.9, args.adam_beta2))  # type: ignore[arg-type]
        self.clock = None if args.max_minutes is None and args.save_every_minutes is None else RunClock(
            args.max_minutes, args.save_every_minutes, self.rt)
        warmup, _ = args.warmup(args.first_length)
        self.scheduler = warmup_decay(self.optimizer, warmup, args.first_length, args.decay, args.decay_ratio)
        # the run's length and warmup: --max-steps, or what the time budget decides as the run goes
        self.length = RunLength(args.first_length, args.warmup, self.scheduler, args.decay, args.decay_ratio,
                                self.rt.is_main)
        self.stepper = TrainStep(self.model, self.optimizer, self.scheduler, max_grad_norm=args.max_grad_norm,
                                 device=self.rt.device, precision=self.autocast_dtype, world_size=self.rt.world_size,
                                 max_skipped_steps=args.max_skipped_steps)
        self.stream = build_stream(args, self.out, self.corpus, self.tokenizer, self.rt)
        self.evaluation = None if not args.evaluates else HeldOutEvaluation(
            build_eval_set(args, self.corpus, self.tokenizer), args.eval_every or args.save_every,
            args.early_stop_patience, self.rt, self.stepper.autocast, args.fsdp, self.objective.eval_sums,
            self.objective.eval_results)
        self.tokens_seen = 0
        self.checkpoints = TrainingCheckpoints(self.out, self.rt, self.stepper, args.keep_checkpoints, self.config,
                                               counters=("tokens_seen",))
        # per-step metrics since the last row of metrics.jsonl; checkpointed, so that the first row after a resume
        # averages the same steps as in an uninterrupted run
        self.metrics_window: list[dict[str, float]] = []
        self.window_tokens = 0  # tokens of this process's steps since the last row (tokens/s)

    @property
    def step(self) -> int:
        """Optimizer steps taken (or skipped): the shared `TrainStep`'s count."""
        return self.stepper.step

    @step.setter
    def step(self, value: int) -> None:
        self.stepper.step = value

    @property
    def skipped_steps(self) -> int:
        return self.stepper.skipped_steps

    @skipped_steps.setter
    def skipped_steps(self, value: int) -> None:
        self.stepper.skipped_steps = value

    # ------------------------------------------------------------------ set-up
    def abandon(self) -> None:
        """After a failure: the run --overwrite set aside goes back in place, and the lock is released."""
        self.lifecycle.abandon()

    def close(self) -> None:
        """Release the lock on OUT (the run is over, or this object will not run)."""
        self.lifecycle.close()

    def finish(self) -> None:
        """After a successful run: drop the DDP wrapper, then destroy the process group. DDP's reducer holds the
        group; were the reducer the last holder, the group would be destroyed inside the reducer's destructor, which
        holds the GIL while it waits for gloo's worker thread, and that thread may need the GIL to free a finished
        barrier's tensors: the process hangs after the run (seen under torchrun, 2 CPU processes, PyTorch 2.13)."""
        self.train_model = self.model
        gc.collect()  # the wrapper may sit in a reference cycle
        teardown_runtime(self.rt)  # on success only: after an error, other ranks may still be inside a collective

    # ------------------------------------------------------------------ checkpoints
    def snapshot(self) -> None:
        """Mid-run (a wall-time checkpoint, a stop signal: `training.loop`): OUT/model and the curves as they stand,
        so that a run cut off by any means leaves a usable model (the demo's every minute: `args.DEMO`)."""
        self.export(self.out / "model")  # every rank: gathering FSDP shards is a collective
        if self.rt.is_main:
            plot_metrics(self.out / "metrics.jsonl", self.out / "training_curves.png")
            log.info("the model after %d of %d steps is in %s (the same command with --resume continues the run)",
                     self.step, self.length.steps, self.out / "model")

    def save_checkpoint(self) -> None:
        """Everything that decides what comes next (`TrainingCheckpoints.save`): weights, optimizer, schedule, RNGs,
        the stream's position, and the counters and metrics window of this trainer."""
        counters: dict[str, Any] = {"tokens_seen": self.tokens_seen, "metrics_window": self.metrics_window,
                                    "tokenizer": self.tokenizer.fingerprint()}
        if self.evaluation is not None:
            counters["evaluation"] = self.evaluation.state_dict()
        if self.clock is not None:
            counters["clock"] = self.clock.state_dict(self.length.steps)
        self.checkpoints.save(self.stream.state_dict(), counters)

    def restore(self, loaded: Loaded) -> None:
        """This trainer's part of a checkpoint being read: the stream's position, the tokens seen, the metrics
        window (a damaged or absent one starts anew) and the held-out evaluation's record."""
        trainer = loaded.trainer
        self.check_same_tokenizer(trainer.get("tokenizer"))
        self.stream.load_state_dict(loaded.data)
        self.tokens_seen = trainer["tokens_seen"]
        window = trainer.get("metrics_window", [])
        self.metrics_window = window if number_list(window) and all(isinstance(w, dict) for w in window) else []
        if self.evaluation is not None and "evaluation" in trainer:
            self.evaluation.load_state_dict(trainer["evaluation"])
        if self.clock is not None:
            self.length.set(self.clock.load_state_dict(trainer.get("clock")), self.step)

    def check_same_tokenizer(self, then: Any) -> None:
        """Refuse to resume with a vocabulary other than the one the checkpoint was trained with (its
        `Vocabulary.fingerprint`; checkpoints from before it was recorded hold none): the cause named in one line,
        not as weights that no longer fit."""
        now = self.tokenizer.fingerprint()
        if then is None or list(then) == now:
            return
        where = self.args.tokenizer or self.args.init_from or self.out / "tokenizer"
        sizes = (f"{then[0]:,} tokens then, {now[0]:,} now" if then[0] != now[0]
                 else f"{now[0]:,} tokens both, other tokens or ids")
        raise DataChanged(f"cannot resume: the tokenizer ({where}) differs from the one the checkpoints were trained "
                          f"with ({sizes}); was it replaced (train-tokenizer --out)? Put the run's tokenizer back, or "
                          f"start a new run")

    def resume(self) -> None:
        """Continue from the newest checkpoint that loads; a corrupt one is reported and the previous one tried
        (`TrainingCheckpoints.resume`)."""
        self.checkpoints.resume(self.restore)

    # ------------------------------------------------------------------ the step
    def forward_backward(self, batch: dict[str, torch.Tensor], weights: dict[str, float]) -> dict[str, torch.Tensor]:
        """One micro-batch forward and backward: the objective's (`Objective.forward_backward`)."""
        batch = {k: v.to(self.rt.device, non_blocking=True) for k, v in batch.items()}
        return self.objective.forward_backward(self.train_model, self.stepper, batch, weights)

    def loss_counts(self, batch: dict[str, torch.Tensor]) -> dict[str, int]:
        """What each loss term is averaged over (`Objective.counts`)."""
        return self.objective.counts(batch)

    def train_step(self) -> dict[str, float]:
        """One optimizer step over `grad_accum` micro-batches (`TrainStep.run`). A non-finite loss or gradient skips
        the update."""
        batches = [next(self.stream) for _ in range(self.args.grad_accum)]
        outcome = self.stepper.run(batches, lambda b, w: self.forward_backward(b, w), self.loss_counts, self.train_model)
        totals = outcome.totals
        first, rest = self.objective.statistics(totals)  # metrics.jsonl's columns: the objective's around the step's
        result: dict[str, Any] = {"loss": totals["loss"].item(), **first, "lr": outcome.lr, "grad_norm": outcome.grad_norm.item(),
                  "tokens": int(totals["tokens"].item()), **rest}
        self.tokens_seen += result["tokens"]
        return result

    def run(self) -> Path:
        """Train to the run's length and export OUT/model. A failure before the first checkpoint puts back the run
        that --overwrite set aside; the lock on OUT is released at the end either way."""
        with self.lifecycle.guarded():
            return self.run_locked()

    def run_locked(self) -> Path:
        a = self.args
        if a.resume:
            self.resume()
        metrics = open_metrics(self.out, a.resume, self.step > 0, self.step, enabled=self.rt.is_main)
        self.record = metrics.write
        if self.on_demo_corpus and self.step == 0:
            self.demo("before training")
        if self.step == 0:
            self.evaluate_now()  # where the run starts from (an --init-from checkpoint, or random weights)
        self.model.train()
        cadence = Cadence(a.log_every, self.evaluation.every if self.evaluation is not None else None, a.save_every)
        total = None if self.length.provisional else self.length.steps  # a budget not yet timed
        try:
            with progress_bar(total, self.step, "pretraining", not (self.rt.is_main and a.progress),
                              dynamic_ncols=True) as bar:
                TrainLoop(self, cadence, self.length, metrics.write, bar, self.clock, self.lifecycle, self.rt).run()
        finally:
            metrics.close()
        final = self.out / "model"
        self.export(final)  # every rank: gathering FSDP shards is a collective
        if self.on_demo_corpus:
            self.demo("after training")
        if self.rt.is_main:
            plot_metrics(self.out / "metrics.jsonl", self.out / "training_curves.png")
            summary = metrics_summary(self.out / "metrics.jsonl", self.config.vocab_size)
            if summary:
                log.info("%s", summary)
            log.info("done: %d steps (%d skipped), %s tokens; model in %s", self.step, self.skipped_steps, f"{self.tokens_seen:,}", final)
        barrier(self.rt)
        return final

    # ------------------------------------------------------------------ what the loop asks (`train_loop.LoopTrainer`)
    def finished(self) -> bool:
        return self.step >= self.length.steps or (self.evaluation is not None and self.evaluation.stopped)

    def record_step(self, result: dict[str, float]) -> None:
        """A step's statistics into the window of the next metrics row (restored by a resume); tokens/s counts this
        process's steps only."""
        self.window_tokens += result.pop("tokens")  # type: ignore[assignment]
        self.metrics_window.append({k: float(v) for k, v in result.items()})

    def period_ends(self) -> bool:
        return self.step == self.length.steps

    def log_row(self, on_grid: bool, seconds: float) -> dict[str, Any]:
        window = self.metrics_window
        row = {"step": self.step, **{k: float(np.mean([w[k] for w in window])) for k in window[0]}}
        row["lr"] = window[-1]["lr"]
        row["tokens_per_s"] = self.window_tokens / max(seconds, 1e-9)
        row["skipped_steps"] = self.skipped_steps
        if on_grid:  # a last row off the log_every grid keeps its window going, so that a run resumed past its
            window.clear()  # length logs the rows of one that never stopped there
        self.window_tokens = 0
        return row

    @staticmethod
    def progress(row: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{row['loss']:.3f}", "lr": f"{row['lr']:.2e}", "tok_s": f"{row['tokens_per_s']:,.0f}"}

    def end_period(self, stop: bool) -> None:
        """The end of the run: nothing more to do before its last checkpoint."""

    def evaluate_now(self, period_end: bool = False) -> bool:
        """Evaluate on the held-out set, when the run has one (every rank: its share, summed over all): a row of
        metrics.jsonl, and OUT/best/ when the eval loss is the lowest so far. True when early stopping ends the run."""
        evaluation = self.evaluation
        if evaluation is None:
            return False
        result = evaluation.evaluate(self.model)
        self.record({"type": "eval", "step": self.step, **result})
        if evaluation.record(self.step, result["eval_loss"]):
            self.export(self.out / "best", {"step": self.step, **result})
        elif evaluation.stopped and self.rt.is_main:
            log.info("early stop at step %d: no lower eval loss in %d evaluations; the best, %.4f at step %d, is in %s",
                     self.step, evaluation.since_best, evaluation.best_loss, evaluation.best_step, self.out / "best")
        return evaluation.stopped

    @property
    def on_demo_corpus(self) -> bool:
        """Whether the demo's [MASK] probes mean something here: they ask about the demo world, so only a run on
        the demo corpus (with `demo` on) prints them, never one on a user's corpus."""
        return self.args.demo and all(Path(c).resolve() == Path(DEMO_CORPUS).resolve() for c in self.corpus)

    def demo(self, title: str) -> None:
        """[MASK] predictions for the demo sentences, logged by rank 0. Under FSDP each forward all-gathers the
        shards, so every rank must run it (rank 0 alone would wait forever for the others); under DDP the bare
        model is local and rank 0 alone runs it."""
        if self.args.fsdp or self.rt.is_main:
            show_predictions(self.model, self.tokenizer, title, self.rt.device, emit=self.rt.is_main,
                             logits=self.objective.masked_logits)

    def export(self, target: Path, evaluation: dict[str, Any] | None = None) -> None:
        """`OUT/model/` (or `OUT/best/`, with its `evaluation` in eval.json) in Hugging Face layout: config.json,
        model.safetensors and the tokenizer files; and every other network the objective exports beside it
        (`Objective.exports`, `objectives.network_dir`: replaced-token detection's generator). Called on every rank
        (under FSDP the full state dict is gathered collectively); rank 0 alone writes."""
        weights = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not self.rt.is_main:
            return
        refuse_nonfinite(weights, str(target))  # type: ignore[arg-type]
        a = self.args
        recipe = {"objective": a.objective, "masking": a.masking, "mlm_probability": a.mlm_probability,
                  "max_length": a.max_length, "batch_size": a.batch_size, "max_steps": a.max_steps, "lr": a.lr}
        metrics = {k: v for k, v in (evaluation or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        card = ModelCard(base_model=a.init_from, datasets=tuple(self.corpus), recipe=recipe, metrics=metrics,
                         metrics_on="the held-out text (eval.json)", trained_by="pretrain")
        for name, export in self.objective.exports(self.model, weights, self.config).items():  # type: ignore[arg-type]
            with atomic_directory(network_dir(target, name)) as tmp:
                export.save_pretrained(tmp, card)  # type: ignore[operator]
                self.tokenizer.save_pretrained(tmp)
                if evaluation is not None:
                    (tmp / "eval.json").write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")


def pretrain(args: PretrainArgs | None = None, **settings: Any) -> Path:
    """Train a BERT from raw text; returns the directory of the final Hugging Face-layout model.

    Pass a `PretrainArgs` (every setting as it stands), or its fields as keywords, which resolve their defaults as
    `bertforge pretrain` does (`run_settings`: with no corpus, the demo's): `pretrain(config="deberta-v3-tiny",
    max_steps=800)` is the same run as `bertforge pretrain --config deberta-v3-tiny --max-steps 800`."""
    if args is not None and settings:
        raise BertforgeError("pass a PretrainArgs or settings as keywords, not both")
    args = args if args is not None else run_settings(settings)
    trainer = Pretrainer(args)
    final = trainer.run()
    trainer.finish()
    return final
