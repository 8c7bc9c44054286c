"""Numerics of the training loop: a NaN or inf in the loss or in any gradient skips the update and is counted,
leaving weights and optimizer state exactly as they were; a huge but finite loss spike is tamed by gradient
clipping (post-clip norm <= max_grad_norm) and leaves the optimizer state finite and bounded; and two runs with
the same seed end with bitwise-identical weights (different seeds do not)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer
from tests.helpers import make_run_inputs, tiny_run_args
from tests.reliability.rel_helpers import one_torch_thread, report, tensors_differ


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_run_inputs(tmp_path_factory.mktemp("numerics"))


def run_args(inputs, out: Path, **kw) -> PretrainArgs:
    return tiny_run_args(inputs, out, **{"max_steps": 8, "lr": 1e-3, "warmup_steps": 2, "save_every": 8,
                                         "log_every": 1, **kw})


def snapshot(trainer: Pretrainer) -> dict[str, torch.Tensor]:
    """Weights and every optimizer-state tensor, copied."""
    out = {f"param {k}": v.detach().clone() for k, v in trainer.model.state_dict().items()}
    for i, state in enumerate(trainer.optimizer.state_dict()["state"].values()):
        for k, v in state.items():
            if torch.is_tensor(v):
                out[f"optim {i} {k}"] = v.clone()
    return out


def all_finite(tensors: dict[str, torch.Tensor]) -> bool:
    return all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point())


# Poisons, by step (1-based) of an 8-step run: what goes wrong in that step's backward pass.
POISONS = {
    2: "NaN loss",
    3: "inf in one gradient element",
    5: "inf loss",
    6: "NaN in one gradient element",
    7: "-inf gradients everywhere",
}


def poison(stats: dict, model: torch.nn.Module, what: str) -> None:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if what == "NaN loss":
        stats["loss"] = torch.tensor(float("nan"))
    elif what == "inf loss":
        stats["loss"] = torch.tensor(float("inf"))
    elif what == "inf in one gradient element":
        grads[len(grads) // 2].view(-1)[0] = float("inf")
    elif what == "NaN in one gradient element":
        grads[-1].view(-1)[-1] = float("nan")
    else:
        for g in grads:
            g.fill_(float("-inf"))


def run_without_updates_at(inputs, out: Path, steps, monkeypatch, **kw) -> Pretrainer:
    """The same run with nothing poisoned, where the optimizer simply does not act at `steps` (1-based): what a
    skipped step must amount to. The batches of those steps are still drawn and their forward and backward passes
    still run (so the data position and the RNGs advance alike), and the schedule still moves on."""
    real_step = Pretrainer.train_step

    def train_step(self):
        if self.step + 1 not in steps:
            return real_step(self)
        update = self.optimizer.step
        self.optimizer.step = lambda *args, **kwargs: None
        try:
            return real_step(self)
        finally:
            self.optimizer.step = update

    with monkeypatch.context() as m:
        m.setattr(Pretrainer, "train_step", train_step)
        with one_torch_thread():
            trainer = Pretrainer(run_args(inputs, out, **kw))
            trainer.run()
    return trainer


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_non_finite_steps_are_skipped_counted_and_change_nothing(inputs, tmp_path, monkeypatch, grad_accum):
    """Each poisoned step leaves weights and optimizer state bit for bit as they were, and the whole run ends bitwise
    equal to a clean run whose optimizer did nothing at those steps (so nothing of a skipped step leaks into a
    later one either)."""
    reference = snapshot(run_without_updates_at(inputs, tmp_path / "reference", set(POISONS), monkeypatch,
                                                grad_accum=grad_accum))
    real_fb, real_step = Pretrainer.forward_backward, Pretrainer.train_step
    seen: dict[int, tuple[dict, dict]] = {}

    def poisoned_forward_backward(self, batch, scale):
        stats = real_fb(self, batch, scale)
        micro = getattr(self, "_micro", 0)
        self._micro = micro + 1
        if self.step + 1 in POISONS and micro == 0:  # with grad_accum=2 only the first micro-batch is poisoned
            poison(stats, self.model, POISONS[self.step + 1])
        return stats

    def watched_train_step(self):
        self._micro = 0
        before = snapshot(self)
        result = real_step(self)
        if self.step in POISONS:
            seen[self.step] = (before, snapshot(self))
        return result

    monkeypatch.setattr(Pretrainer, "forward_backward", poisoned_forward_backward)
    monkeypatch.setattr(Pretrainer, "train_step", watched_train_step)
    with one_torch_thread():
        trainer = Pretrainer(run_args(inputs, tmp_path / "run", grad_accum=grad_accum))
        trainer.run()
    assert trainer.skipped_steps == len(POISONS)
    for step, (before, after) in seen.items():
        assert not tensors_differ(before, after), f"step {step} ({POISONS[step]}) changed weights or optimizer state"
    final = snapshot(trainer)
    assert all_finite(final)
    differ = tensors_differ(reference, final)
    assert not differ, f"the run with skipped steps ends unlike the run that left those updates out: {differ[:5]}"
    assert trainer.optimizer.state_dict()["state"], "no update was ever taken"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped_steps"] for r in rows] == [sum(s <= r["step"] for s in POISONS) for r in rows]
    report(f"non-finite steps skipped {trainer.skipped_steps} / {len(POISONS)} injected (grad_accum={grad_accum}: "
           f"{', '.join(POISONS.values())}); weights and optimizer state finite and unchanged by the skipped steps, "
           f"the final state bitwise equal to a clean run without those {len(POISONS)} updates")


@pytest.mark.parametrize("optimizer", ["adamw", pytest.param("lamb", marks=pytest.mark.slow)])
def test_a_huge_finite_loss_spike_is_clipped(inputs, tmp_path, monkeypatch, optimizer):
    """Step 4's loss and gradients are multiplied by 1e12 (finite in float32): the update is taken, with the
    gradient clipped to norm 1, so Adam's second moment stays <= 1 and no weight jumps.

    The calm run's step-4 gradient has a norm above 1 too (asserted), so clipping turns both into the same unit
    vector up to rounding: the spiky run must end where the calm one does, to well under one learning rate. Measured
    2026-11-24: 7.5e-9 (AdamW), bar lr / 1000 = 1e-6; with clipping off (max_grad_norm=1e30) the gap is 3.3e-3."""
    spike = 1e12
    real_fb = Pretrainer.forward_backward
    post_clip: list[float] = []

    def spiky(self, batch, scale):
        stats = real_fb(self, batch, scale)
        if self.step == 3:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(spike)
            stats["loss"] = stats["loss"] * spike
        return stats

    def watch_optimizer(trainer: Pretrainer) -> None:
        def record(optimizer, args, kwargs):  # runs just before each update, after clipping
            grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
            post_clip.append(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item())

        trainer.optimizer.register_step_pre_hook(record)

    with one_torch_thread():
        calm = Pretrainer(run_args(inputs, tmp_path / "calm", optimizer=optimizer))
        calm.run()
        monkeypatch.setattr(Pretrainer, "forward_backward", spiky)
        trainer = Pretrainer(run_args(inputs, tmp_path / "spiky", optimizer=optimizer))
        watch_optimizer(trainer)
        trainer.run()
    assert trainer.skipped_steps == 0, "a finite spike must not be skipped"
    assert len(post_clip) == 8 and all(n <= 1.0 + 1e-6 for n in post_clip), post_clip
    state = snapshot(trainer)
    assert all_finite(state)
    second_moments = [t for k, t in state.items() if k.endswith("exp_avg_sq")]
    assert second_moments and max(t.max().item() for t in second_moments) <= 1.0 + 1e-6
    calm_rows = [json.loads(line) for line in (tmp_path / "calm" / "metrics.jsonl").read_text().splitlines()]
    max_grad_norm = run_args(inputs, tmp_path).max_grad_norm
    assert calm_rows[3]["grad_norm"] > max_grad_norm, "precondition: the calm step 4 is clipped as well"
    drift = max((state[k] - v).abs().max().item() for k, v in snapshot(calm).items() if k.startswith("param"))
    bar = run_args(inputs, tmp_path).lr / 1000
    assert drift <= bar, f"the spike moved a weight {drift} away from the calm run (bar {bar})"
    rows = [json.loads(line) for line in (tmp_path / "spiky" / "metrics.jsonl").read_text().splitlines()]
    assert math.isfinite(rows[3]["grad_norm"]) and rows[3]["grad_norm"] > 1e9  # the pre-clip norm is logged


def test_same_seed_same_bits_other_seed_other_bits(inputs, tmp_path):
    """Weights and optimizer state after 6 steps, bit for bit. (That a killed and resumed run ends bitwise equal to
    an uninterrupted one, across processes, is test_rel_crash.py's job.)"""
    states, losses = {}, {}
    with one_torch_thread():
        for name, seed in (("a", 3), ("b", 3), ("c", 4)):
            trainer = Pretrainer(run_args(inputs, tmp_path / name, seed=seed))
            losses[name] = [trainer.train_step()["loss"] for _ in range(6)]
            states[name] = snapshot(trainer)
    assert not tensors_differ(states["a"], states["b"]) and losses["a"] == losses["b"]
    assert tensors_differ(states["a"], states["c"])
