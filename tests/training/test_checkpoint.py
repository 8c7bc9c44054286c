"""`bertforge.training.checkpoint`: a checkpoint's trainer_state.json is checked as it is read, a trainer's window of
metrics is told from anything else, and a process's random states are saved and restored."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bertforge.core.errors import BertforgeError
from bertforge.training.checkpoint import TRAINER_STATE, number_list, read_trainer_state, rng_state, set_rng_state

GOOD = {"step": 8, "skipped_steps": 1, "world_size": 2, "epoch": 1}


def written(directory, state):
    (directory / TRAINER_STATE).write_text(json.dumps(state), encoding="utf-8")
    return directory


def test_trainer_state_is_checked_as_it_is_read(tmp_path):
    state = read_trainer_state(written(tmp_path, GOOD), world_size=2, counters=("epoch",))
    assert state == {**GOOD, "consecutive_skipped": 0}  # a checkpoint of an older version: the neutral count
    for stored, read in ((3, 3), (-1, 0), ("2", 0)):
        state = read_trainer_state(written(tmp_path, {**GOOD, "consecutive_skipped": stored}), world_size=2)
        assert state["consecutive_skipped"] == read
    missing = {k: v for k, v in GOOD.items() if k != "skipped_steps"}
    for bad in ({**GOOD, "step": -1}, {**GOOD, "step": 1.5}, {**GOOD, "world_size": True}, missing,
                {**GOOD, "epoch": "1"}, [GOOD]):
        with pytest.raises(BertforgeError, match="expected non-negative integers step, skipped_steps, world_size, epoch"):
            read_trainer_state(written(tmp_path, bad), world_size=2, counters=("epoch",))
    with pytest.raises(BertforgeError, match=r"written by 2 processes; resuming needs the same number \(now 1\)"):
        read_trainer_state(written(tmp_path, GOOD), world_size=1)


def test_number_list_tells_a_window_of_metrics():
    assert number_list([1, 2.5, {"loss": 0.3, "tokens": 12}]) and number_list([])
    for other in ([True], ["1"], [{"loss": None}], (1, 2), 3, None):
        assert not number_list(other), other


def test_random_states_are_restored():
    state = rng_state()
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_a_resume_restores_the_random_states_the_checkpoint_saved(tmp_path):
    """Through `TrainingCheckpoints` itself (the audit's mutant skipping `set_rng_state` on resume was caught only
    by the end-to-end bitwise resume tests): after a save, draws from Python, NumPy and torch; the RNGs move on;
    `resume` brings them back, so the same draws come again, and the model and step are the checkpoint's."""
    from torch import nn

    from bertforge.core.system import Runtime
    from bertforge.training.checkpoint import TrainingCheckpoints
    from bertforge.training.optim import warmup_decay
    from bertforge.training.step import TrainStep

    def draws():
        return random.random(), float(np.random.rand()), torch.rand(3).tolist()

    def checkpoints():
        torch.manual_seed(0)
        model = nn.Linear(3, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
        stepper = TrainStep(model, optimizer, warmup_decay(optimizer, 0, 10, "constant"), device=torch.device("cpu"))
        rt = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
        return TrainingCheckpoints(tmp_path, rt, stepper, keep=2), model

    saver, model = checkpoints()
    model(torch.ones(1, 3)).sum().backward()
    saver.stepper.optimizer.step()  # an optimizer with state, as a trainer's checkpoint holds
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    saver.save({"position": 0}, {})
    after_save = draws()
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # the RNGs move on (another process, later)
    assert draws() != after_save
    resumer, fresh = checkpoints()
    with torch.no_grad():
        fresh.weight.add_(1.0)  # not the checkpoint's weights until the resume
    loaded = resumer.resume(lambda loaded: None)
    assert loaded is not None and loaded.step == 0
    assert draws() == after_save
    assert torch.equal(fresh.weight, model.weight)


def test_a_checkpoint_save_removes_the_half_built_checkpoints_of_any_step(tmp_path):
    import torch

    from bertforge.core import io
    from tests.core.test_io import dead_pid
    from bertforge.core.system import Runtime
    from bertforge.training.checkpoint import TrainingCheckpoints
    from bertforge.training.optim import warmup_decay
    from bertforge.training.step import TrainStep

    half = tmp_path / "checkpoints" / f".step-7.{io._HOST}-{dead_pid()}.q1w2e3.tmp"
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"half")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    stepper = TrainStep(model, optimizer, warmup_decay(optimizer, 0, 10, "constant"), device=torch.device("cpu"))
    stepper.step = 9
    rt = Runtime(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    TrainingCheckpoints(tmp_path, rt, stepper, keep=2).save({}, {})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-9"]
