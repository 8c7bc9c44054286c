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
records its data position), its checkpoint (`save_checkpoint`) and a usable model mid-run (`snapshot`); it says
nothing of *when*.

Stopping. While the loop runs, SIGINT (Ctrl-C) and SIGTERM do not kill the run: they ask it to stop after the step
in hand (`StopSignals`). The loop then checkpoints, takes a snapshot (pretraining: `OUT/model` and its curves) and
raises `Interrupted`, which the command line turns into exit status 128 + the signal's number; a second signal
stops the run at once, as without the loop. A wall-time checkpoint (`--save-every-minutes`) takes a snapshot too, so
that a run cut off by any means (a kill, a lost machine) leaves a model no older than that interval.

`RunLifecycle` is the run directory's lifecycle around it (`run_dir.RunDirectory` on rank 0: lock and checks,
the first change to OUT, the run --overwrite replaced dropped at the first checkpoint or put back on failure, the
lock released), and `open_metrics` the metrics log of a run that may resume (rows after the step resumed from are
dropped).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .run_dir import RunDirectory
from ..core.system import Runtime, all_ranks_agree, barrier, on_main
from .time_budget import RunClock, RunLength
from .log import MetricsLog

log = logging.getLogger("bertforge")

Row = dict[str, Any]
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # what asks a running loop to stop after its step, with a checkpoint


class Interrupted(KeyboardInterrupt):
    """The loop stopped at a step boundary on a signal (`StopSignals`), after its checkpoint and snapshot.
    `exit_status` is the shell's for a process that a signal ended: 128 + its number."""

    def __init__(self, signum: int, step: int) -> None:
        super().__init__(f"interrupted ({signal.Signals(signum).name}) at step {step}")
        self.signum, self.step = signum, step

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class StopSignals:
    """SIGINT and SIGTERM caught while a loop runs: the first asks for a stop (`requested`), and puts the previous
    handlers back, so that a second one acts as it would have without the loop (Ctrl-C twice: KeyboardInterrupt
    now). Handlers can only be set in the main thread: a loop run in another thread is not caught."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    @contextlib.contextmanager
    def caught(self) -> Iterator[StopSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        self.previous = {s: signal.signal(s, self.handle) for s in STOP_SIGNALS}
        try:
            yield self
        finally:
            self.restore()

    def handle(self, signum: int, frame: Any) -> None:
        self.signum = signum
        self.restore()
        log.warning("%s: stopping after this step, with a checkpoint (again: stop now, without one)",
                    signal.Signals(signum).name)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}

    def agreed(self, rt: Runtime | None) -> int | None:
        """The signal that stops the run after this step, None to go on; every rank agrees (one all-reduce when
        distributed: a signal reaches the ranks at different steps)."""
        if rt is None or not rt.distributed:
            return self.signum
        if all_ranks_agree(rt, self.signum is None):
            return None
        return self.signum if self.signum is not None else signal.SIGTERM


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

    def snapshot(self) -> None: ...  # a usable model mid-run: at a wall-time checkpoint, and when interrupted


class TrainLoop:
    """Runs a `LoopTrainer` from its current step to the end of its data, its length or early stopping, or to a
    stop signal (`Interrupted`). `record` writes a metrics row; `bar` is a tqdm bar (or None); `lifecycle` learns of
    every checkpoint; `rt`: the ranks that must agree on a stop."""

    def __init__(self, trainer: LoopTrainer, cadence: Cadence, length: RunLength, record: Callable[[Row], Any],
                 bar: Any = None, clock: RunClock | None = None, lifecycle: RunLifecycle | None = None,
                 rt: Runtime | None = None) -> None:
        self.trainer, self.cadence, self.length, self.record = trainer, cadence, length, record
        self.bar, self.clock, self.lifecycle = bar, clock, lifecycle
        self.rt = rt
        self.signals = StopSignals()

    def run(self) -> None:
        with self.signals.caught():
            self.run_steps()

    def run_steps(self) -> None:
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
            signum = self.signals.agreed(self.rt)
            if period_end or stop or timed_save or signum is not None or cadence.due(cadence.save_every, step):
                t.save_checkpoint()
                if self.lifecycle is not None:
                    self.lifecycle.checkpointed()
            if signum is not None or (timed_save and not t.finished()):
                t.snapshot()
            if signum is not None:
                raise Interrupted(signum, step)
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
