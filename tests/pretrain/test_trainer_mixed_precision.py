"""Pretraining (`bertforge.pretrain.trainer`) in half precision on the CPU: bf16 and fp16 steps keep fp32 weights, and a
resumed fp16 run ends bitwise where the uninterrupted one did, its loss scale included. (The shared step's mixed
precision: tests/training/test_step_mixed_precision.py.)"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.pretrain.trainer import Pretrainer, pretrain
from tests.helpers import tiny_run_args

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py


def args(corpus_and_tokenizer, out: Path, **kw):
    return tiny_run_args(corpus_and_tokenizer, out, **{"max_steps": 6, "lr": 1e-3, "warmup_steps": 1, "save_every": 2,
                                                       "log_every": 1, "device": "cpu", **kw})


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_pretraining_half_precision_steps_keep_fp32_weights(corpus_and_tokenizer, tmp_path, precision):
    trainer = Pretrainer(args(corpus_and_tokenizer, tmp_path / "run", precision=precision))
    try:
        results = [trainer.train_step() for _ in range(3)]
    finally:
        trainer.close()
    assert all(math.isfinite(r["loss"]) for r in results)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert trainer.stepper.scaler.is_enabled() == (precision == "fp16")


def scale_pattern(monkeypatch) -> None:
    """fp16 scalers that start at 2^10 and double after 3 clean steps, and a third step whose gradients overflow
    (set to inf, the loss finite): steps 1-2 clean, step 3 skipped (2^9), step 4 clean, so the step-4 checkpoint
    holds scale 2^9 and one clean step towards growth, neither of them the starting state; step 6 doubles it."""
    real = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", functools.partial(real, init_scale=2.0**10, growth_interval=3))
    forward_backward = Pretrainer.forward_backward

    def overflow_at_three(self, batch, weights):
        stats = forward_backward(self, batch, weights)
        if self.step == 2:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("inf"))
        return stats

    monkeypatch.setattr(Pretrainer, "forward_backward", overflow_at_three)


class Crash(Exception):
    pass


def test_fp16_pretraining_resume_is_bitwise_identical(corpus_and_tokenizer, tmp_path, monkeypatch):
    """A run stopped after its step-4 checkpoint and resumed ends bitwise where the uninterrupted run did: weights,
    metrics and trainer state, the loss scale and its growth count among them."""
    scale_pattern(monkeypatch)
    straight = tmp_path / "straight"
    pretrain(args(corpus_and_tokenizer, straight, precision="fp16"))
    state = lambda run, step: json.loads((run / "checkpoints" / f"step-{step}" / "trainer_state.json").read_text())  # noqa: E731
    assert state(straight, 4)["grad_scaler"]["scale"] == 2.0**9 and state(straight, 4)["grad_scaler"]["_growth_tracker"] == 1
    final = state(straight, 6)
    assert final["skipped_steps"] == 1 and final["consecutive_skipped"] == 0
    assert final["grad_scaler"]["scale"] == 2.0**10 and final["grad_scaler"]["_growth_tracker"] == 0

    broken = tmp_path / "broken"
    real_step = Pretrainer.train_step

    def crash_at_five(self):
        if self.step == 4:
            raise Crash()
        return real_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", crash_at_five)
    with pytest.raises(Crash):
        pretrain(args(corpus_and_tokenizer, broken, precision="fp16"))
    monkeypatch.setattr(Pretrainer, "train_step", real_step)
    pretrain(args(corpus_and_tokenizer, broken, precision="fp16", resume=True))

    a, b = (load_file(str(d / "model" / "model.safetensors")) for d in (straight, broken))
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda d: [{k: v for k, v in json.loads(r).items() if k != "tokens_per_s"}  # noqa: E731
                       for r in (d / "metrics.jsonl").read_text().splitlines()]
    assert strip(straight) == strip(broken)
    assert state(broken, 6) == final
