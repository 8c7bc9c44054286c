"""A training run measured in wall time: `--max-minutes` (a budget: the run fits its step count, and so its
learning-rate schedule, to the time it has) and `--save-every-minutes` (checkpoints at multiples of a wall-time
interval).

Training time is the training loop's: from the first step to the last, the checkpoints and evaluations inside it
included; start-up (vocabulary, evaluation set) and the export after the last step are not. A resumed run goes on
counting from the time its checkpoint recorded.

How the budget sets the length. The first `SKIPPED_STEPS` steps of a process are not timed (memory allocation and
kernel selection make them slow). After `CALIBRATION_STEPS` more, the run estimates the steps that fit:
step + (budget left) / (seconds per step so far), and takes that as `--max-steps`. It re-estimates after every
later step for as long as the learning rate does not depend on the run's length yet (`optim.decay_start`: during
the warmup, and through the stable phase of `--decay wsd`), so that a changed estimate never changes a learning
rate already used; the measured time per step then includes the checkpoints and evaluations seen so far. Once the
decay has begun the length is fixed. If the budget runs out before that length is reached (the machine slowed
down), the run stops there anyway, with its checkpoint and model, before the decay has reached 0. The first
estimate is always taken, even when the decay has begun (`--decay linear` without warmup): the steps before it ran
on a provisional schedule.

A budget makes the step count depend on the machine's speed: the run records the one it chose (in metrics.jsonl's
last row and in every checkpoint); `--max-steps N` with that N repeats the schedule exactly.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.distributed as dist

from ..core.errors import BertforgeError
from .optim import decay_start, set_schedule_length
from ..core.system import Runtime

log = logging.getLogger("bertforge")

SKIPPED_STEPS = 2  # not timed: a process's first steps allocate memory and pick kernels
CALIBRATION_STEPS = 10  # timed steps before the first estimate
PROVISIONAL_STEPS = 10**9  # the length of a budgeted run before its first estimate: the schedule never decays
STATE_VERSION = 1


class RunClock:
    """The training time of a run, what it decides (the length that fits `minutes`, whether a wall-time checkpoint
    is due) and its record in a checkpoint (`state_dict`)."""

    def __init__(self, minutes: float | None, save_every_minutes: float | None, rt: Runtime) -> None:
        self.budget = None if minutes is None else 60.0 * minutes
        self.interval = None if save_every_minutes is None else 60.0 * save_every_minutes
        self.rt = rt
        self.spent = 0.0  # training seconds of the processes before this one (a resumed run)
        self.estimated = False  # the budget has set the run's length at least once
        self.fixed = False  # the decay has begun: the length no longer changes
        self.saves = 0  # wall-time checkpoint marks passed
        self.started: float | None = None  # perf_counter() when this process started training
        self.timed_from: tuple[int, float] | None = None  # (step, perf_counter()) where the step timing starts
        self.first_step = 0

    def start(self, step: int) -> None:
        """The training loop begins at `step` (0, or the step a resumed run continues from)."""
        self.started, self.first_step, self.timed_from = time.perf_counter(), step, None
        if self.interval is not None:
            self.saves = int(self.spent // self.interval)

    def elapsed(self) -> float:
        """Training seconds so far, earlier processes included."""
        return self.spent + (0.0 if self.started is None else time.perf_counter() - self.started)

    def seconds_per_step(self, step: int) -> float | None:
        """The mean time of this process's steps after the untimed ones, once `CALIBRATION_STEPS` were timed."""
        if self.timed_from is None:
            if step - self.first_step >= SKIPPED_STEPS:
                self.timed_from = (step, time.perf_counter())
            return None
        timed = step - self.timed_from[0]
        return (time.perf_counter() - self.timed_from[1]) / timed if timed >= CALIBRATION_STEPS else None

    def tick(self, step: int, max_steps: int, decay_from: Callable[[int], int]) -> tuple[int, bool]:
        """After a step: (the run's length in steps, whether a wall-time checkpoint is due now). `decay_from(T)`:
        the first step whose learning rate depends on a length T. The length is `step` itself when the budget is
        spent. Every rank gets the same answer (the shortest length and any rank's checkpoint mark)."""
        length = self.plan(step, max_steps, decay_from)
        due = self.interval is not None and self.elapsed() >= (self.saves + 1) * self.interval
        if self.rt.distributed:
            agreed = torch.tensor([length, 0 if due else 1], dtype=torch.float64, device=self.rt.device)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
            length, due = int(agreed[0].item()), agreed[1].item() == 0
        if due:
            self.saves = int(self.elapsed() // cast(float, self.interval))  # due: there is an interval
        if length != max_steps and self.rt.is_main:
            if length <= step:
                log.info("--max-minutes %g: the time is up at step %d", cast(float, self.budget) / 60, step)
            elif max_steps == PROVISIONAL_STEPS:
                log.info("--max-minutes %g: %d steps fit (timed over steps %d-%d)", cast(float, self.budget) / 60, length,
                         step - CALIBRATION_STEPS, step)
        return length, due

    def plan(self, step: int, max_steps: int, decay_from: Callable[[int], int]) -> int:
        """The run's length after `step` steps (`max_steps` so far): see the module's docstring."""
        if self.budget is None:
            return max_steps
        if self.elapsed() >= self.budget:
            return step
        per_step = self.seconds_per_step(step)
        if per_step is None or self.fixed:
            return max_steps
        if self.estimated and step >= decay_from(max_steps):
            self.fixed = True  # the decay has begun: its slope stays as it is
            return max_steps
        length = step + max(1, math.floor((self.budget - self.elapsed()) / per_step))
        if self.estimated:  # a learning rate already used must not change: the new decay starts now at the earliest
            while decay_from(length) < step:
                length += 1
        self.estimated = True
        return length

    def state_dict(self, max_steps: int) -> dict[str, Any]:
        return {"version": STATE_VERSION, "seconds": self.elapsed(), "max_steps": max_steps,
                "estimated": self.estimated, "fixed": self.fixed}

    def load_state_dict(self, state: dict[str, Any] | None) -> int | None:
        """Take a checkpoint's record; returns the run's length it holds (None: a checkpoint without one)."""
        if state is None:
            return None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise BertforgeError(f"run clock state {state!r} is not version {STATE_VERSION}")
        self.spent, self.estimated, self.fixed = float(state["seconds"]), bool(state["estimated"]), bool(state["fixed"])
        return int(state["max_steps"])


class RunLength:
    """How many optimizer steps the run takes and the warmup of its schedule: the state a time budget changes as
    the run goes (`RunClock.tick`), never written back into the run's settings. `warmup_for(steps)`: the warmup
    (and a warning, or None) the settings give a run of `steps` steps; `scheduler`: the schedule to refit, of
    decay `decay` (with `decay_ratio`); None: no schedule follows the length."""

    def __init__(self, steps: int, warmup_for: Callable[[int], tuple[int, str | None]] | None = None,
                 scheduler: Any = None, decay: str = "linear", decay_ratio: float = 0.1, is_main: bool = True) -> None:
        self.steps = steps
        self.warmup_for, self.scheduler, self.decay, self.decay_ratio = warmup_for, scheduler, decay, decay_ratio
        self.is_main = is_main
        self.warmup, note = warmup_for(steps) if warmup_for is not None else (0, None)
        if note and is_main:
            log.warning("%s", note)

    @property
    def provisional(self) -> bool:
        """A budgeted run before its first estimate: its length is not known yet."""
        return self.steps == PROVISIONAL_STEPS

    def decay_from(self, total: int) -> int:
        """The first step whose learning rate depends on a run length `total` (`optim.decay_start`)."""
        return decay_start(self.warmup, total, self.decay, self.decay_ratio)

    def set(self, length: int | None, step: int) -> bool:
        """Give the run (after `step` steps) the length `length` (None: keep it): its step count and its schedule
        (left as it is at the budget's end, `length` <= `step`). A warmup that the first length leaves no room for
        is cut, with a warning, as for --max-steps. True when the length changed."""
        if length is None or length == self.steps:
            return False
        first, self.steps = self.provisional, length
        if length <= step:
            return True
        if first and self.warmup_for is not None:
            self.warmup, note = self.warmup_for(length)
            if note and self.is_main:
                log.warning("%s", note)
        if self.scheduler is not None:
            set_schedule_length(self.scheduler, self.warmup, length, self.decay, self.decay_ratio)
        return True
