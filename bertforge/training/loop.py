"""The one training loop every trainer runs on: pretraining (and distillation), fine-tuning (and sentence
embeddings).

`TrainLoop` owns what every run does around its steps: the logging cadence (a metrics row every `log_every` steps
and at the end of each period), when to evaluate (every `eval_every` steps and at the end of each period) and early
stopping, when to checkpoint (every `save_every` steps, at the end of each period, where early stopping ends the
run, and when the wall-time clock says so), the progress bar, and the time budget (`time_budget.RunClock` and
`RunLength`: the run's length lives here, never in the settings). A *period* is what ends with an evaluation and a
checkpoint whatever the cadence: a fine-tuning epoch, or the whole pretraining run.

A trainer (`LoopTrainer`) brings its model, data, `forward_backward` and evaluation: one optimizer step
(`train_step`), what a step adds to the next row (`record_step`) and the row itself (`log_row`), its evaluation
(`evaluate_now`, True to stop early), the end of a period (`period_ends` says a step ended one, `end_period`
records its data position) and its checkpoint (`save_checkpoint`); it says nothing of *when*.

`RunLifecycle` is the run directory's lifecycle around it (`run_dir.RunDirectory` on rank 0: lock and checks,
the first change to OUT, the run --overwrite replaced dropped at the first checkpoint or put back on failure, the
lock released), and `open_metrics` the metrics log of a run that may resume (rows after the step resumed from are
dropped).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .run_dir import RunDirectory
from ..core.system import Runtime, barrier, on_main
from .time_budget import RunClock, RunLength
from .log import MetricsLog

Row = dict[str, Any]


@dataclass(frozen=True)
class Cadence:
    """When a run logs, evaluates and checkpoints inside a period (every N optimizer steps; None or 0: never)."""

    log_every: int
    eval_every: int | None = None
    save_every: int | None = None

    def due(self, every: int | None, step: int) -> bool:
        return bool(every) and step % every == 0  # type: ignore[operator]


class LoopTrainer(Protocol):
    """What a trainer brings to `TrainLoop`."""

    @property
    def step(self) -> int: ...  # optimizer steps taken (or skipped)

    def finished(self) -> bool: ...  # nothing left to train: the data is used up, or early stopping ended the run

    def train_step(self) -> Any: ...  # one optimizer step; its result goes to `record_step`

    def record_step(self, result: Any) -> None: ...

    def period_ends(self) -> bool: ...  # the step just taken ends a period (an epoch, the run)

    def log_row(self, on_grid: bool, seconds: float) -> Row: ...  # the row; `seconds` since the last one

    def progress(self, row: Row) -> dict[str, str]: ...  # the progress bar's postfix for a row

    def evaluate_now(self, period_end: bool) -> bool: ...  # True: stop early

    def end_period(self, stop: bool) -> None: ...

    def save_checkpoint(self) -> None: ...


class TrainLoop:
    """Runs a `LoopTrainer` from its current step to the end of its data, its length or early stopping.
    `record` writes a metrics row; `bar` is a tqdm bar (or None); `lifecycle` learns of every checkpoint."""

    def __init__(self, trainer: LoopTrainer, cadence: Cadence, length: RunLength, record: Callable[[Row], Any],
                 bar: Any = None, clock: RunClock | None = None, lifecycle: RunLifecycle | None = None) -> None:
        self.trainer, self.cadence, self.length, self.record = trainer, cadence, length, record
        self.bar, self.clock, self.lifecycle = bar, clock, lifecycle

    def run(self) -> None:
        t, cadence = self.trainer, self.cadence
        row_start = time.perf_counter()
        if self.clock is not None:
            self.clock.start(t.step)
        while not t.finished():
            result = t.train_step()
            timed_save = self.follow_clock()
            t.record_step(result)
            if self.bar is not None:
                self.bar.update(1)
            step, period_end = t.step, t.period_ends()
            on_grid = step % cadence.log_every == 0
            if on_grid or period_end:
                row = t.log_row(on_grid, time.perf_counter() - row_start)
                self.record(row)
                if self.bar is not None:
                    self.bar.set_postfix(**t.progress(row))
                row_start = time.perf_counter()
            stop = (period_end or cadence.due(cadence.eval_every, step)) and t.evaluate_now(period_end)
            if period_end:
                t.end_period(stop)
            if period_end or stop or timed_save or cadence.due(cadence.save_every, step):
                t.save_checkpoint()
                if self.lifecycle is not None:
                    self.lifecycle.checkpointed()
            if stop:
                break

    def follow_clock(self) -> bool:
        """After a step, with a clock (--max-minutes, --save-every-minutes): the run's length, fitted to the budget,
        and whether a wall-time checkpoint is due."""
        if self.clock is None:
            return False
        length, due = self.clock.tick(self.trainer.step, self.length.steps, self.length.decay_from)
        if self.length.set(length, self.trainer.step) and self.bar is not None:
            self.bar.total = length
            self.bar.refresh()
        return due


@contextlib.contextmanager
def progress_bar(total: int | None, initial: int, description: str, disable: bool | None,
                 dynamic_ncols: bool = False, redirect_logging: bool = False) -> Iterator[Any]:
    """A tqdm bar of optimizer steps (None when `disable` is True); `redirect_logging`: log lines go through it."""
    if disable is True:
        yield None
        return
    from tqdm.auto import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    redirect = logging_redirect_tqdm() if redirect_logging else contextlib.nullcontext()
    with redirect, tqdm(total=total, initial=initial, desc=description, unit="step", disable=disable,
                        dynamic_ncols=dynamic_ncols) as bar:
        yield bar


def open_metrics(out: Path, resume: bool, resumed: bool, step: int, enabled: bool = True) -> MetricsLog:
    """OUT/metrics.jsonl and OUT/tensorboard/: rows after the step resumed from are dropped (all of them when a
    resume found no checkpoint to continue from)."""
    return MetricsLog(out / "metrics.jsonl", -1 if resume and not resumed else step, out / "tensorboard",
                      enabled=enabled)


class RunLifecycle:
    """A run directory's lifecycle (`RunDirectory`), acted on by rank 0 with every rank learning the outcome."""

    def __init__(self, run_dir: RunDirectory, rt: Runtime) -> None:
        self.run_dir, self.rt = run_dir, rt

    def lock(self, check: Callable[[], None] | None = None) -> None:
        """Rank 0 locks OUT (a second run into it is refused, naming this one's pid), finishes what an interrupted
        --overwrite left, and checks OUT (and `check()`) without changing anything; every rank learns the outcome.
        One lock, rank 0's: rank 0 alone writes the run's files, and OUT may sit on a filesystem other hosts
        share, where a lock per host would not exclude a second launch elsewhere."""
        on_main(self.rt, lambda: self.run_dir.lock_and_check(check))

    def prepare(self) -> None:
        """The first change to OUT, once the run has been checked (see `RunDirectory.prepare`)."""
        if self.rt.is_main:
            self.run_dir.prepare()
        barrier(self.rt)

    def checkpointed(self) -> None:
        """The new run has a checkpoint: the run --overwrite replaced can go."""
        if self.rt.is_main:
            self.run_dir.drop_replaced()

    def abandon(self) -> None:
        """After a failure: the run --overwrite set aside goes back in place, and the lock is released."""
        if self.rt.is_main:
            self.run_dir.abandon()

    def close(self) -> None:
        """Release the lock on OUT (the run is over, or will not run)."""
        self.run_dir.close()

    @contextlib.contextmanager
    def guarded(self) -> Iterator[None]:
        """A failure inside puts back the run --overwrite set aside; the lock is released at the end either way."""
        try:
            yield
        except BaseException:
            self.abandon()
            raise
        finally:
            self.close()
