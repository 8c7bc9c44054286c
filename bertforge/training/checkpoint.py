"""The checkpoints of a training run: one interface for every trainer (pretraining and fine-tuning, and so
distillation and sentence embeddings, built on them).

A checkpoint is everything that decides what the run does next, in a directory `OUT/checkpoints/step-N/` built
under a temporary name and renamed into place (`io.atomic_directory`), so that a kill at any moment leaves only
complete checkpoints:

    model.safetensors        the weights (the full state dict, gathered from every rank under FSDP)
    config.json              the model's config (the directory loads as a Hugging Face checkpoint)
    optimizer.*, scheduler.* their state dicts (`state.save_state`: JSON + safetensors, never a pickle)
    rng.*                    every rank's Python, NumPy, torch and CUDA random states, one entry a rank
    data.*                   every rank's data position (what the trainer's reader says it is), one entry a rank
    NAME.*                   any other state a trainer keeps (fine-tuning: the best evaluation's weights)
    trainer_state.json       the `TrainStep` counters, the number of processes, and the trainer's JSON counters

`TrainingCheckpoints.save` writes one (every rank calls it: gathering is collective; rank 0 writes), and
`TrainingCheckpoints.resume` reads back the newest one that loads, checked, falling back to the one before when a
file is damaged, every rank taking the same decision.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ..model.checkpoint import read_state_dict
from ..core.errors import BertforgeError
from ..core.io import atomic_directory, sweep_stale
from .run_dir import list_checkpoints
from ..core.state import DataChanged, load_state, save_state
from ..core.system import Runtime, all_ranks_agree, barrier
from .step import TrainStep, nonfinite_error

log = logging.getLogger("bertforge")

TRAINER_STATE = "trainer_state.json"
COUNTERS = ("step", "skipped_steps", "world_size")  # what every trainer_state.json holds, non-negative integers


def rng_state() -> dict[str, Any]:
    """This process's random states: Python's, NumPy's, torch's and (where there is one) every CUDA device's."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def read_trainer_state(path: Path, world_size: int, counters: Sequence[str] = ()) -> dict[str, Any]:
    """A checkpoint's trainer_state.json, checked: `COUNTERS` and the trainer's own `counters` are non-negative
    integers, written by `world_size` processes; `consecutive_skipped`, which checkpoints of older versions lack
    (or hold damaged), gets its neutral value."""
    trainer = json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))
    fields = (*COUNTERS, *counters)
    if not isinstance(trainer, dict) or not all(type(trainer.get(k)) is int and trainer[k] >= 0 for k in fields):
        raise BertforgeError(f"{path / TRAINER_STATE}: expected non-negative integers {', '.join(fields)}")
    if trainer["world_size"] != world_size:
        raise BertforgeError(
            f"{path} was written by {trainer['world_size']} processes; resuming needs the same number (now {world_size})"
        )
    consecutive = trainer.get("consecutive_skipped", 0)
    trainer["consecutive_skipped"] = consecutive if type(consecutive) is int and consecutive >= 0 else 0
    return trainer


def number_list(value: Any) -> bool:
    """Whether `value` is a list of numbers, or of dicts of numbers (a trainer's window of per-step metrics)."""
    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    return isinstance(value, list) and all(
        number(v) or (isinstance(v, dict) and all(number(x) for x in v.values())) for v in value
    )


@dataclass
class Loaded:
    """A checkpoint read back: its counters (trainer_state.json), this rank's data position, and the model and
    optimizer states waiting to be applied (`TrainingCheckpoints.apply_weights`)."""

    path: Path
    step: int
    trainer: dict[str, Any]
    data: Any
    weights: dict[str, torch.Tensor] = field(repr=False)
    optimizer: Any = field(repr=False)

    def state(self, name: str) -> Any:
        """A trainer's other state `name` (see `TrainingCheckpoints.save`), checked as it is read."""
        return load_state(self.path, name)


class TrainingCheckpoints:
    """The checkpoints of one run in `out`/checkpoints: the model, optimizer and schedule of `stepper`, its
    counters, every rank's RNGs, the trainer's data position and counters. `keep`: complete checkpoints kept (older
    ones are deleted after each save); `counters`: the names of the trainer's own counters that must be
    non-negative integers in every checkpoint it reads."""

    def __init__(self, out: Path, rt: Runtime, stepper: TrainStep, keep: int, config: Any = None,
                 counters: Sequence[str] = ()) -> None:
        self.out, self.rt, self.stepper, self.keep, self.config = Path(out), rt, stepper, keep, config
        self.counters = tuple(counters)

    @property
    def root(self) -> Path:
        return self.out / "checkpoints"

    def gathered(self, local: Any) -> list[Any]:
        """`local` of every rank, in rank order (on every rank)."""
        if not self.rt.distributed:
            return [local]
        every = [None] * self.rt.world_size
        dist.all_gather_object(every, local)
        return every

    def save(self, data: Any, counters: dict[str, Any], states: dict[str, Any] | None = None) -> Path:
        """Write `step-<step>` (every rank calls this; rank 0 writes): weights, optimizer, schedule, every rank's
        RNGs and `data` (this rank's data position), `states` (name: a nest of tensors and values), and the JSON
        `counters` in trainer_state.json. Never a checkpoint with NaN or infinite weights; older checkpoints beyond
        `keep` are deleted. Returns the checkpoint's path."""
        stepper, rt = self.stepper, self.rt
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = cast("dict[str, torch.Tensor]", get_model_state_dict(stepper.model, options=options))  # full: tensors
        optim_state = get_optimizer_state_dict(stepper.model, stepper.optimizer, options=options)
        rngs, data = self.gathered(rng_state()), self.gathered(data)
        target = self.root / f"step-{stepper.step}"
        error = nonfinite_error(weights, f"step {stepper.step} to {self.out}") if rt.is_main else None
        if not all_ranks_agree(rt, error is None):
            raise error or BertforgeError(f"step {stepper.step}: rank 0 found non-finite weights; not saving")
        if rt.is_main:
            trainer = {**stepper.state_dict(), "world_size": rt.world_size, **counters}
            sweep_stale(self.root)  # the half-built checkpoints of a run killed mid-save, whatever their step
            with atomic_directory(target) as tmp:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"),
                          metadata={"format": "pt"})
                if self.config is not None:
                    self.config.save_pretrained(tmp)
                save_state(tmp, "optimizer", optim_state)
                save_state(tmp, "scheduler", stepper.scheduler.state_dict())
                save_state(tmp, "rng", rngs)
                save_state(tmp, "data", data)
                for name, state in (states or {}).items():
                    save_state(tmp, name, state)
                (tmp / TRAINER_STATE).write_text(json.dumps(trainer) + "\n", encoding="utf-8")
            self.prune()
        barrier(rt)
        return target

    def prune(self) -> None:
        """Delete the complete checkpoints beyond the newest `keep` (rank 0)."""
        for _, old in list_checkpoints(self.out)[: -self.keep]:
            doomed = old.with_name(f".{old.name}.deleting")  # one atomic rename: never half-deleted yet listed
            os.replace(old, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def read(self, path: Path, restore: Callable[[Loaded], None]) -> Loaded:
        """Read and check every file of the checkpoint at `path` and restore what is local to this rank: the
        schedule, the step counters, `restore(loaded)` (the trainer's data position and counters), then the RNGs.
        No collectives, so that a failure here is agreed on before any rank enters the weights' collectives."""
        trainer = read_trainer_state(path, self.rt.world_size, self.counters)
        weights, _ = read_state_dict(path / "model.safetensors")
        optim_state = load_state(path, "optimizer")
        sched_state = load_state(path, "scheduler")
        rngs = load_state(path, "rng")
        data = load_state(path, "data")
        loaded = Loaded(path, trainer["step"], trainer, data[self.rt.rank], weights, optim_state)
        restore(loaded)
        self.stepper.scheduler.load_state_dict(sched_state)
        self.stepper.load_state_dict(trainer)
        set_rng_state(rngs[self.rt.rank])
        return loaded

    def apply_weights(self, loaded: Loaded) -> None:
        """Model and optimizer state; under FSDP this shards the full tensors, a collective every rank enters."""
        model = self.stepper.model
        options = StateDictOptions(full_state_dict=True, strict=False)  # unused heads (NSP with --no-nsp) have no optimizer state
        set_model_state_dict(model, cast("dict[str, Any]", loaded.weights), options=options)
        set_optimizer_state_dict(model, self.stepper.optimizer, loaded.optimizer, options=options)
        loaded.weights, loaded.optimizer = {}, None  # applied: not kept twice in memory

    def resume(self, restore: Callable[[Loaded], None]) -> Loaded | None:
        """Continue from the newest checkpoint that loads (`restore`: see `read`); a damaged one is reported and the
        previous one tried. None when there is no checkpoint yet. Every rank takes the same decision (a rank alone
        falling back would leave the others in a collective)."""
        found = list_checkpoints(self.out)
        for step, path in reversed(found):
            loaded, error, refusal = None, None, None
            try:
                loaded = self.read(path, restore)
            except DataChanged as err:  # not damage: every older checkpoint would differ alike
                refusal = err
            except Exception as err:  # whatever is wrong with a damaged checkpoint, the previous one may be fine
                error = f"{type(err).__name__}: {err}"
            if not all_ranks_agree(self.rt, refusal is None):
                raise refusal or DataChanged("cannot resume: another rank's data differs from the checkpoint's")
            if all_ranks_agree(self.rt, error is None):
                try:  # every rank reads the same files, so every rank fails (or not) here alike
                    self.apply_weights(cast(Loaded, loaded))  # read, on every rank (no error)
                except Exception as err:
                    error = f"{type(err).__name__}: {err}"
            else:
                error = error or "unusable on another rank"
            if not all_ranks_agree(self.rt, error is None):
                log.warning("checkpoint %s is unusable (%s); trying the previous one", path, error or "unusable on another rank")
                continue
            if self.rt.is_main:
                log.info("resumed from %s (step %d)", path, step)
            return loaded
        if found:
            raise BertforgeError(f"no checkpoint in {self.root} could be loaded")
        if self.rt.is_main:
            log.info("--resume: no checkpoint in %s yet, starting from step 0", self.out)
        return None
