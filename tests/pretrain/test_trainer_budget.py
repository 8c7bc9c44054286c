"""A pretraining run measured in wall time: --max-minutes fits the step count and the schedule to a budget,
--save-every-minutes checkpoints at wall-time marks. Time is a fake clock that each training step advances, so the
tests are exact on a busy machine."""

from __future__ import annotations

import json

import pytest
import torch

import bertforge.training.time_budget as time_budget
from bertforge import BertforgeError
from bertforge.training.optim import decay_start, schedule_factor
from bertforge.pretrain.trainer import Pretrainer, pretrain
from bertforge.training.run_dir import list_checkpoints
from tests.helpers import tiny_run_args

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py

PEAK = 1e-3


class FakeTime:
    """`time_budget`'s clock: `now` seconds, moved on by `seconds(step)` before each training step."""

    def __init__(self, seconds=lambda step: 1.0):
        self.now, self.seconds = 0.0, seconds

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def fake_time(monkeypatch):
    return use_fake_time(monkeypatch)


def use_fake_time(monkeypatch) -> FakeTime:
    """A `FakeTime` as `time_budget`'s clock, moved on before each pretraining step (also the fixture of the command
    tests, `tests/commands/test_pretrain.py`)."""
    clock = FakeTime()
    monkeypatch.setattr(time_budget, "time", clock)
    real_step = Pretrainer.train_step

    def step(self):
        clock.now += clock.seconds(self.step)
        return real_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", step)
    return clock


def rows(out, kind=None):
    found = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in found if r.get("type") == kind]


def budget_args(inputs, out, **settings):
    base = dict(max_minutes=0.5, warmup_steps=2, decay="wsd", lr=PEAK, log_every=1, save_every=1000, keep_checkpoints=100,
                nsp=False)
    return tiny_run_args(inputs, out, **{**base, **settings})


def test_budget_sets_the_length_and_the_schedule_ends_on_time(corpus_and_tokenizer, tmp_path, fake_time, caplog):
    """1 s a step and 30 s: the first 2 steps untimed, 10 timed, then 12 + 18 = 30 steps fit; the wsd schedule of
    30 steps (decay over the last 3) runs to its end; checkpoints every 0.1 minute = 6 s = 6 steps."""
    caplog.set_level("INFO")
    out = tmp_path / "run"
    pretrain(budget_args(corpus_and_tokenizer, out, save_every_minutes=0.1))
    lrs = {r["step"]: r["lr"] for r in rows(out)}
    assert max(lrs) == 30
    factor = schedule_factor(2, 30, "wsd", 0.1)
    assert [lrs[s] for s in range(1, 31)] == pytest.approx([PEAK * factor(t) for t in range(30)])
    assert lrs[28] == PEAK and lrs[29] == pytest.approx(PEAK * 2 / 3) and lrs[30] == pytest.approx(PEAK / 3)
    assert [s for s, _ in list_checkpoints(out)] == [6, 12, 18, 24, 30]
    state = json.loads((out / "checkpoints" / "step-18" / "trainer_state.json").read_text())
    assert state["clock"] == {"version": 1, "seconds": 18.0, "max_steps": 30, "estimated": True, "fixed": False}
    assert "--max-minutes 0.5: 30 steps fit (timed over steps 2-12)" in caplog.text
    assert (out / "model" / "model.safetensors").is_file()


def test_a_slower_machine_shortens_the_run_without_changing_a_used_learning_rate(corpus_and_tokenizer, tmp_path,
                                                                                  fake_time):
    """Steps slow from 1 s to 3 s at step 20 of a 60 s budget: the length is re-estimated down while the wsd
    schedule is at its peak, the decay starts where the last estimate puts it, every learning rate follows the
    schedule of the final length (none used was changed afterwards), and the run ends when the time is up."""
    fake_time.seconds = lambda step: 1.0 if step < 20 else 3.0
    out = tmp_path / "run"
    pretrain(budget_args(corpus_and_tokenizer, out, max_minutes=1.0, decay_ratio=0.5))
    lrs = {r["step"]: r["lr"] for r in rows(out)}
    last = max(lrs)
    assert fake_time.now >= 60.0 and fake_time.now - 3.0 < 60.0  # stopped by the first step past the budget
    state = json.loads((out / "checkpoints" / f"step-{last}" / "trainer_state.json").read_text())["clock"]
    assert state["fixed"] and state["max_steps"] == last
    values = [lrs[s] for s in range(1, last + 1)]
    assert values[1] == PEAK and all(a >= b for a, b in zip(values[1:], values[2:]))  # the peak, then down only
    # the row of step s logs the rate of 0-based step s - 1; the decay's first step runs at the peak
    decay_from = next(s for s in range(3, last + 1) if lrs[s] < PEAK) - 2
    assert 12 < decay_from < 30  # the first estimate (step 12: 60 steps) put it at 30; the slow-down moved it
    lengths = [t for t in range(decay_from, 200) if decay_start(2, t, "wsd", 0.5) == decay_from]
    follows = lambda total: values[decay_from:] == pytest.approx(  # noqa: E731
        [PEAK * schedule_factor(2, total, "wsd", 0.5)(t) for t in range(decay_from, last)])
    assert any(follows(total) for total in lengths), (decay_from, lengths, values[decay_from:])


def test_a_resumed_budgeted_run_is_bitwise_identical(corpus_and_tokenizer, tmp_path, fake_time, monkeypatch):
    """A crash after the step-18 checkpoint: the resumed run restores its time (18 s) and length (30) and ends as
    the uninterrupted one, weights and rows alike."""
    straight = tmp_path / "straight"
    pretrain(budget_args(corpus_and_tokenizer, straight, save_every_minutes=0.1))
    broken = tmp_path / "broken"
    fake_time.now = 0.0
    timed_step = Pretrainer.train_step

    def crash(self):
        if self.step == 20:
            raise KeyboardInterrupt
        return timed_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", crash)
    with pytest.raises(KeyboardInterrupt):
        pretrain(budget_args(corpus_and_tokenizer, broken, save_every_minutes=0.1))
    monkeypatch.setattr(Pretrainer, "train_step", timed_step)
    assert [s for s, _ in list_checkpoints(broken)] == [6, 12, 18]
    pretrain(budget_args(corpus_and_tokenizer, broken, save_every_minutes=0.1, resume=True))
    assert [s for s, _ in list_checkpoints(broken)] == [6, 12, 18, 24, 30]
    strip = lambda found: [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in found]  # noqa: E731
    assert strip(rows(straight)) == strip(rows(broken))
    from safetensors.torch import load_file

    a, b = (load_file(str(run / "model" / "model.safetensors")) for run in (straight, broken))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_wall_time_checkpoints_without_a_budget(corpus_and_tokenizer, tmp_path, fake_time):
    """--save-every-minutes beside --max-steps: the length and schedule are --max-steps', checkpoints come at every
    3 s (0.05 minute) of training time and at the end."""
    out = tmp_path / "run"
    pretrain(tiny_run_args(corpus_and_tokenizer, out, max_steps=10, save_every_minutes=0.05, save_every=1000,
                           keep_checkpoints=100, log_every=1, nsp=False))
    assert [s for s, _ in list_checkpoints(out)] == [3, 6, 9, 10]
    assert max(r["step"] for r in rows(out)) == 10


def test_time_up_before_the_first_estimate_stops_with_a_model(corpus_and_tokenizer, tmp_path, fake_time):
    fake_time.seconds = lambda step: 4.0  # 0.1 minute = 6 s: the second step is past it
    out = tmp_path / "run"
    pretrain(budget_args(corpus_and_tokenizer, out, max_minutes=0.1))
    assert [r["step"] for r in rows(out)] == [1, 2]
    assert [s for s, _ in list_checkpoints(out)] == [2] and (out / "model" / "config.json").is_file()


@pytest.mark.parametrize("change, message", [
    (dict(max_steps=50), "--max-minutes contradicts --max-steps"),
    (dict(warmup_ratio=0.1, warmup_steps=100), "--max-minutes contradicts --warmup-ratio"),
    (dict(max_minutes=0.0), "--max-minutes must be a positive number of minutes"),
    (dict(max_minutes=float("inf")), "--max-minutes must be a positive number of minutes"),
    (dict(save_every_minutes=-1.0), "--save-every-minutes must be a positive number of minutes"),
])
def test_bad_budget_settings_are_refused_before_anything_is_written(corpus_and_tokenizer, tmp_path, change, message):
    with pytest.raises(BertforgeError, match=message):
        pretrain(budget_args(corpus_and_tokenizer, tmp_path / "run", **change))
    assert not (tmp_path / "run").exists()
