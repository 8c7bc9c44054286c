"""`bertforge.training.time_budget`: `RunClock` times the steps after the first untimed ones, fits the run's length to
--max-minutes, marks --save-every-minutes checkpoints, and records itself for a resumed run. Time is a fake clock."""

from __future__ import annotations

import pytest
import torch

import bertforge.training.time_budget as time_budget
from bertforge.core.errors import BertforgeError
from bertforge.core.system import Runtime
from bertforge.training.time_budget import PROVISIONAL_STEPS, RunClock

ONE_PROCESS = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(time_budget, "time", fake)
    return fake


def test_the_budget_fits_the_run_to_the_time_left(clock):
    run = RunClock(minutes=1.0, save_every_minutes=None, rt=ONE_PROCESS)
    run.start(0)
    length, lengths = PROVISIONAL_STEPS, []
    for step in range(1, 31):
        clock.now += 2.0  # every step takes 2 s
        length, due = run.tick(step, length, lambda total: total)
        lengths.append(length)
        assert not due  # no --save-every-minutes
    # steps 1-2 untimed, 3-12 timed: then 12 + (60 s - 24 s) / 2 s = 30 steps fit, and at step 30 the time is up
    assert lengths[:11] == [PROVISIONAL_STEPS] * 11 and lengths[11:] == [30] * 19
    assert run.state_dict(30) == {"version": 1, "seconds": 60.0, "max_steps": 30, "estimated": True, "fixed": False}


def test_wall_time_checkpoints_and_a_resumed_runs_clock(clock):
    run = RunClock(minutes=None, save_every_minutes=0.1, rt=ONE_PROCESS)  # a checkpoint every 6 s
    run.start(0)
    due_at = []
    for step in range(1, 11):
        clock.now += 1.5
        length, due = run.tick(step, 10, lambda total: total)
        assert length == 10  # no budget: --max-steps decides
        if due:
            due_at.append(step)
    assert due_at == [4, 8]  # at 6 s and 12 s
    record = run.state_dict(10)
    assert record == {"version": 1, "seconds": 15.0, "max_steps": 10, "estimated": False, "fixed": False}
    resumed = RunClock(minutes=None, save_every_minutes=0.1, rt=ONE_PROCESS)
    assert resumed.load_state_dict(None) is None  # a checkpoint without a record
    assert resumed.load_state_dict(record) == 10
    clock.now = 100.0
    resumed.start(10)
    assert resumed.elapsed() == 15.0 and resumed.saves == 2  # the earlier process's time counts
    clock.now = 103.0
    assert resumed.tick(11, 10, lambda total: total) == (10, True)  # 18 s: the third mark
    with pytest.raises(BertforgeError, match="is not version 1"):
        resumed.load_state_dict({**record, "version": 2})
