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
