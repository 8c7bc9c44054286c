"""`bertforge.training.loop`: the one loop every trainer runs on, with a fake trainer that records what the loop asks
of it: rows on the logging cadence and at each period's end, evaluations on theirs, checkpoints at every mark and
where early stopping ends the run, the run's length from a clock, and the run directory's lifecycle."""

from __future__ import annotations

import os
import signal
import threading

import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.pretrain.args import PRETRAINING
from bertforge.training.run_dir import RunDirectory
from bertforge.core.system import Runtime
from bertforge.training.time_budget import RunLength
from bertforge.training.loop import STOP_SIGNALS, Cadence, Interrupted, RunLifecycle, TrainLoop, open_metrics

ONE_PROCESS = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class Fake:
    """Periods of `period` steps, `periods` of them; `stop_at`: the step whose evaluation says stop."""

    def __init__(self, period: int, periods: int, stop_at: int | None = None) -> None:
        self.period, self.periods, self.stop_at = period, periods, stop_at
        self.step, self.ended, self.stopped = 0, 0, False
        self.events: list[tuple[str, int]] = []

    def finished(self) -> bool:
        return self.ended >= self.periods or self.stopped

    def train_step(self) -> int:
        self.step += 1
        return self.step

    def record_step(self, result: int) -> None:
        self.events.append(("step", result))

    def period_ends(self) -> bool:
        return self.step % self.period == 0

    def log_row(self, on_grid: bool, seconds: float) -> dict:
        assert seconds >= 0
        self.events.append(("row", self.step))
        return {"step": self.step, "grid": on_grid}

    def progress(self, row: dict) -> dict:
        return {"step": str(row["step"])}

    def evaluate_now(self, period_end: bool) -> bool:
        self.events.append(("eval", self.step))
        self.stopped = self.step == self.stop_at
        return self.stopped

    def end_period(self, stop: bool) -> None:
        self.ended += 1
        self.events.append(("end", self.step))

    def save_checkpoint(self) -> None:
        self.events.append(("save", self.step))

    def snapshot(self) -> None:
        self.events.append(("snapshot", self.step))


def kinds(trainer: Fake, kind: str) -> list[int]:
    return [step for k, step in trainer.events if k == kind]


def test_rows_evaluations_and_checkpoints_on_their_cadence_and_at_each_period_end():
    trainer, rows = Fake(period=5, periods=2), []
    TrainLoop(trainer, Cadence(log_every=2, eval_every=3, save_every=4), RunLength(10), rows.append).run()
    assert kinds(trainer, "row") == [2, 4, 5, 6, 8, 10]  # the grid, and each period's last step
    assert [r["grid"] for r in rows] == [True, True, False, True, True, True]
    assert kinds(trainer, "eval") == [3, 5, 6, 9, 10]
    assert kinds(trainer, "save") == [4, 5, 8, 10]  # each once: step 10 is both a mark and a period's end
    # at a period's end: the row, the evaluation, the end of the period, then the checkpoint
    at_five = [k for k, step in trainer.events if step == 5]
    assert at_five == ["step", "row", "eval", "end", "save"]


def test_early_stopping_checkpoints_and_ends_the_run_there():
    trainer = Fake(period=5, periods=3, stop_at=6)
    TrainLoop(trainer, Cadence(log_every=10, eval_every=3), RunLength(15), lambda row: None).run()
    assert trainer.step == 6 and kinds(trainer, "save") == [5, 6]
    assert kinds(trainer, "row") == [5]


def test_a_finished_trainer_takes_no_step():
    trainer = Fake(period=5, periods=0)
    TrainLoop(trainer, Cadence(log_every=1), RunLength(5), lambda row: None).run()
    assert trainer.events == []


def test_a_clock_sets_the_length_the_loop_keeps_and_never_the_settings():
    class Clock:
        def start(self, step: int) -> None:
            self.started = step

        def tick(self, step: int, length: int, decay_from) -> tuple[int, bool]:
            return (3 if step >= 2 else length), step == 1  # the budget fits 3 steps; a wall-time mark at step 1

    class Bar:
        total, updates = None, 0

        def update(self, n: int) -> None:
            self.updates += n

        def set_postfix(self, **kw) -> None:
            pass

        def refresh(self) -> None:
            pass

    class UpToLength(Fake):
        def finished(self) -> bool:
            return self.step >= length.steps

        def period_ends(self) -> bool:
            return self.step == length.steps

    length, bar = RunLength(10**9), Bar()
    trainer = UpToLength(period=0, periods=1)
    TrainLoop(trainer, Cadence(log_every=100), length, lambda row: None, bar, Clock()).run()
    assert trainer.step == 3 and length.steps == 3 and bar.total == 3 and bar.updates == 3
    assert kinds(trainer, "save") == [1, 3]  # the wall-time mark, and the end
    assert kinds(trainer, "snapshot") == [1]  # a usable model at the mark; the end exports its own


class Signalling(Fake):
    """Sends itself `signals` during step `at` (as a terminal's Ctrl-C or a `kill` would, mid-step)."""

    def __init__(self, at: int, signals: tuple[int, ...], **kw) -> None:
        super().__init__(**kw)
        self.at, self.signals = at, signals

    def train_step(self) -> int:
        step = super().train_step()
        if step == self.at:
            for signum in self.signals:
                os.kill(os.getpid(), signum)
        return step


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_ends_the_run_after_its_step_with_a_checkpoint_and_a_snapshot(signum, caplog):
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    trainer = Signalling(at=3, signals=(signum,), period=5, periods=2)
    with pytest.raises(Interrupted) as stopped:
        TrainLoop(trainer, Cadence(log_every=2, save_every=100), RunLength(10), lambda row: None).run()
    assert stopped.value.step == 3 and stopped.value.exit_status == 128 + signum
    assert f"interrupted ({signal.Signals(signum).name}) at step 3" in str(stopped.value)
    assert trainer.step == 3 and kinds(trainer, "save") == [3] and kinds(trainer, "snapshot") == [3]
    assert [k for k, step in trainer.events if step == 3][-2:] == ["save", "snapshot"]
    assert "stopping after this step" in caplog.text
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before  # the handlers are put back


def test_a_second_ctrl_c_stops_at_once_without_a_checkpoint():
    trainer = Signalling(at=3, signals=(signal.SIGINT, signal.SIGINT), period=5, periods=2)
    with pytest.raises(KeyboardInterrupt) as stopped:
        TrainLoop(trainer, Cadence(log_every=2), RunLength(10), lambda row: None).run()
    assert not isinstance(stopped.value, Interrupted)  # Python's own, raised inside the step
    assert kinds(trainer, "save") == [] and kinds(trainer, "snapshot") == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_loop_outside_the_main_thread_leaves_the_signals_alone():
    seen: list = []

    class Looking(Fake):
        def train_step(self) -> int:
            seen.append(signal.getsignal(signal.SIGINT))
            return super().train_step()

    thread = threading.Thread(target=lambda: TrainLoop(Looking(period=2, periods=1), Cadence(log_every=1),
                                                       RunLength(2), lambda row: None).run())
    thread.start()
    thread.join()
    assert seen == [signal.default_int_handler] * 2


def test_run_length_refits_the_warmup_and_schedule_to_the_first_length_the_budget_gives():
    from bertforge.training.optim import warmup_decay

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    warmup_for = lambda steps: (10, None) if steps > 10 else (steps // 10, "cut")  # noqa: E731
    scheduler = warmup_decay(optimizer, 10, 10**9)
    length = RunLength(10**9, warmup_for, scheduler)
    assert length.provisional and length.warmup == 10
    assert length.set(8, step=2) and length.steps == 8 and length.warmup == 0  # the first length: warmup cut
    assert not length.set(8, step=3) and not length.set(None, step=3)  # unchanged
    assert length.set(3, step=3) and length.steps == 3  # the budget ran out at step 3


def test_the_lifecycle_locks_prepares_and_puts_an_overwritten_run_back_on_failure(tmp_path):
    out = tmp_path / "run"
    first = RunLifecycle(RunDirectory(out, False, False, {"x": 1}, PRETRAINING), ONE_PROCESS)
    with first.guarded():
        first.lock()
        first.prepare()
        (out / "metrics.jsonl").write_text("old\n")
    second = RunLifecycle(RunDirectory(out, False, True, {"x": 2}, PRETRAINING), ONE_PROCESS)
    with pytest.raises(RuntimeError), second.guarded():
        second.lock()
        second.prepare()
        assert not (out / "metrics.jsonl").exists()  # set aside
        raise RuntimeError("the new run fails before its first checkpoint")
    assert (out / "metrics.jsonl").read_text() == "old\n"  # put back
    third = RunLifecycle(RunDirectory(out, False, False, {"x": 3}, PRETRAINING), ONE_PROCESS)
    with pytest.raises(BertforgeError, match="already holds files"), third.guarded():
        third.lock()


def test_open_metrics_drops_rows_after_the_step_resumed_from(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 2}\n{"step": 4}\n')
    open_metrics(tmp_path, resume=True, resumed=True, step=2).close()
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 2}\n'
    open_metrics(tmp_path, resume=True, resumed=False, step=0).close()  # nothing to resume from: no row kept
    assert (tmp_path / "metrics.jsonl").read_text() == ""
