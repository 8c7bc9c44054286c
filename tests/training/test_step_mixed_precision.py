"""Mixed precision in the shared training step (`bertforge.training.step.TrainStep`), on the CPU: fp16 autocast with its
gradient scaler (an overflowing step is skipped and the scale halves, a clean step updates as fp32 does, the scale
is saved and restored) and bf16 autocast (the loss falls, the weights and the optimizer state stay fp32). CPU
autocast is slow, so the models are tiny and the runs a few steps. (Pretraining in half precision, a resumed fp16
run bitwise: tests/pretrain/test_trainer_mixed_precision.py.)"""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bertforge import BertforgeError
from bertforge.training.optim import warmup_decay
from bertforge.training.step import (PRECISION_HELP, PRECISIONS, TrainStep, choose_precision, cpu_bf16_units,
                                     labelled_count, pick_precision)

CPU = torch.device("cpu")


def token_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 5))


def batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"ids": torch.randint(0, 20, (4, 6), generator=g), "labels": torch.randint(0, 5, (4, 6), generator=g)}


def stepper_for(precision: str, model: nn.Module | None = None, optimizer: str = "sgd", **kw) -> TrainStep:
    model = model or token_model()
    opt = (torch.optim.SGD(model.parameters(), lr=0.5) if optimizer == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-2))
    return TrainStep(model, opt, warmup_decay(opt, 0, 100, "constant"), max_grad_norm=1.0, device=CPU,
                     precision=pick_precision(precision, CPU), **kw)


def step(stepper: TrainStep, factor: float = 1.0):
    """One optimizer step on `batch()`; the loss is multiplied by `factor` (1e4: fp16 gradients overflow)."""
    def forward_backward(b, weights):
        with stepper.autocast():
            logits = stepper.model(b["ids"])
            loss = F.cross_entropy(logits.reshape(-1, 5).float(), b["labels"].reshape(-1)) * factor
        return {"loss": stepper.accumulate({"tokens": loss}, weights)}

    return stepper.run([batch()], forward_backward, lambda b: {"tokens": labelled_count(b["labels"])})


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ---------------------------------------------------------------------------------------------------- choices
def fake_cpu(monkeypatch, units: str | None) -> None:
    """The CPU's bf16 units as `cpu_bf16_units` detects them: "AMX", "AVX512-BF16" or none."""
    monkeypatch.delenv("BERTFORGE_CPU_BF16")  # the suite's own setting (tests/conftest.py)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: units == "AMX")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: units in ("AMX", "AVX512-BF16"))


@pytest.mark.parametrize("units", [None, "AVX512-BF16", "AMX"])
def test_auto_trains_in_bf16_on_a_cpu_with_bf16_units_and_infers_in_fp32(monkeypatch, caplog, units):
    """auto: bf16 autocast for training where the CPU has native bf16 units (the detection faked), fp32 where it has
    none; inference (training=False) stays fp32 on any CPU. bf16 asked for on a CPU with the units is not warned
    about; without them it is (emulated), and fp16 always is on a CPU."""
    fake_cpu(monkeypatch, units)
    assert cpu_bf16_units() == units
    choice = choose_precision("auto", CPU)
    assert choice.dtype is (None if units is None else torch.bfloat16)
    assert choice.reason == ("auto: the CPU has no bf16 units (AVX512-BF16, AMX)" if units is None
                             else f"auto: the CPU has {units}")
    assert choose_precision("auto", CPU, training=False).dtype is None
    assert pick_precision("fp32", CPU) is None
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        assert pick_precision("bf16", CPU) is torch.bfloat16
        assert pick_precision("fp16", CPU) is torch.float16
    assert caplog.text.count("slower than fp32") == (2 if units is None else 1)
    assert ("without bf16 (AVX512-BF16 or AMX) units" in caplog.text) == (units is None)


def test_the_environment_switch_takes_the_units_away(monkeypatch):
    fake_cpu(monkeypatch, "AMX")
    monkeypatch.setenv("BERTFORGE_CPU_BF16", "0")
    assert cpu_bf16_units() is None and choose_precision("auto", CPU).dtype is None


def test_precision_choices(caplog):
    assert set(PRECISIONS) == {"auto", "fp32", "bf16", "fp16"}
    assert "on CPU they run, slowly" not in PRECISION_HELP and "a CPU with AVX512-BF16 or AMX" in PRECISION_HELP
    with pytest.raises(BertforgeError, match="unknown --precision 'fp8'; choose auto, fp32, bf16, fp16"):
        pick_precision("fp8", CPU)
    assert not stepper_for("bf16").scaler.is_enabled() and not stepper_for("fp32").scaler.is_enabled()
    assert stepper_for("fp16").scaler.is_enabled()


# ---------------------------------------------------------------------------------------------------- fp16 scaler
def test_fp16_clean_step_updates_as_fp32_does():
    """The scaled gradient, unscaled before clipping: the grad norm is the true one (fp32's, up to fp16 rounding),
    the step updates, the scale is unchanged and one clean step is counted towards its growth."""
    fp32, fp16 = stepper_for("fp32"), stepper_for("fp16")
    before = params(fp16.model)
    a, b = step(fp32), step(fp16)
    assert not b.skipped and fp16.skipped_steps == 0
    assert abs(a.totals["loss"].item() - b.totals["loss"].item()) < 5e-3
    assert b.grad_norm.item() == pytest.approx(a.grad_norm.item(), rel=1e-2)  # not 65536 times larger
    assert fp16.scaler.get_scale() == 2.0**16 and fp16.scaler.state_dict()["_growth_tracker"] == 1
    for p, q, r in zip(fp16.model.parameters(), fp32.model.parameters(), before):
        assert p.dtype == torch.float32  # the master weights stay fp32
        assert not torch.equal(p, r)
        torch.testing.assert_close(p, q, atol=2e-3, rtol=0)


def test_fp16_overflowing_step_is_skipped_and_the_scale_halves(caplog):
    stepper = stepper_for("fp16", optimizer="adamw")
    before = params(stepper.model)
    with caplog.at_level(logging.INFO, logger="bertforge"):
        outcome = step(stepper, factor=1e4)  # a finite loss whose scaled gradients overflow fp16
    assert math.isfinite(outcome.totals["loss"].item()) and not math.isfinite(outcome.grad_norm.item())
    assert outcome.skipped and stepper.skipped_steps == 1 and stepper.step == 1
    assert stepper.consecutive_skipped == 0  # the scale settling, not a diverging run
    assert "fp16 gradients overflowed at loss scale 65536" in caplog.text
    assert stepper.scaler.get_scale() == 2.0**15
    assert all(torch.equal(p, q) for p, q in zip(stepper.model.parameters(), before))
    assert stepper.optimizer.state_dict()["state"] == {}  # Adam never stepped
    assert all(p.grad is None for p in stepper.model.parameters())
    assert stepper.scheduler.last_epoch == 1  # the schedule still advances

    clean = step(stepper)  # then a normal step updates at the halved scale
    assert not clean.skipped and stepper.scaler.get_scale() == 2.0**15
    assert any(not torch.equal(p, q) for p, q in zip(stepper.model.parameters(), before))


def test_fp16_scale_grows_back_after_its_interval_of_clean_steps():
    stepper = stepper_for("fp16")
    stepper.scaler.set_growth_interval(2)
    step(stepper, factor=1e4)
    assert stepper.scaler.get_scale() == 2.0**15
    step(stepper)
    step(stepper)
    assert stepper.scaler.get_scale() == 2.0**16


def test_fp16_overflows_count_towards_divergence_once_the_scale_is_spent():
    """Overflows at a scale above 1 are skipped without end-of-run alarm (three in a row here, with
    max_skipped_steps 2); at scale 1 and below the gradients overflow by themselves, and the run is stopped."""
    stepper = stepper_for("fp16", max_skipped_steps=2)
    for _ in range(3):
        assert step(stepper, factor=1e4).skipped
    assert stepper.skipped_steps == 3 and stepper.consecutive_skipped == 0
    stepper.scaler.update(1.0)
    assert step(stepper, factor=1e9).skipped and stepper.consecutive_skipped == 1
    with pytest.raises(BertforgeError, match="training diverged: 2 steps in a row"):
        step(stepper, factor=1e9)


def test_fp16_non_finite_loss_is_a_skipped_step_towards_divergence():
    stepper = stepper_for("fp16")
    outcome = step(stepper, factor=float("nan"))
    assert outcome.skipped and stepper.consecutive_skipped == 1 and stepper.skipped_steps == 1
    assert stepper.scaler.get_scale() == 2.0**15  # halved as well: the scaler's rule for any skipped step


def test_fp16_gradient_caching_gradients_are_scaled_then_unscaled():
    """`backward_from` (gradient caching) scales the gradients it pushes in like `accumulate` scales the loss, so
    the step unscales both alike."""
    stepper = stepper_for("fp16")
    x = torch.tensor([1.0, 2.0, 3.0])
    weight = stepper.model[1].weight
    stepper.backward_from([(weight[:, :3] * x).sum(0)], [torch.ones(3)], weight=0.5)
    assert torch.equal(weight.grad[0, :3], 0.5 * 2.0**16 * x)
    stepper.scaler.unscale_(stepper.optimizer)
    assert torch.equal(weight.grad[0, :3], 0.5 * x)


# ---------------------------------------------------------------------------------------------------- state
def test_fp16_scale_round_trips_through_a_json_checkpoint(caplog):
    stepper = stepper_for("fp16")
    stepper.scaler.set_growth_interval(5)
    step(stepper, factor=1e4)
    step(stepper)
    state = json.loads(json.dumps(stepper.state_dict()))  # what trainer_state.json holds
    assert state["grad_scaler"]["scale"] == 2.0**15 and state["grad_scaler"]["_growth_tracker"] == 1
    restored = stepper_for("fp16")
    restored.load_state_dict(state)
    assert restored.state_dict() == stepper.state_dict()
    assert (restored.step, restored.skipped_steps) == (2, 1)

    assert "grad_scaler" not in stepper_for("bf16").state_dict()
    stepper_for("bf16").load_state_dict(state)  # another precision: the scale is not needed
    with caplog.at_level(logging.WARNING, logger="bertforge"):
        stepper_for("fp16").load_state_dict({"step": 3, "skipped_steps": 0})  # a checkpoint from before fp16
    assert "no fp16 loss scale; starting from 65536" in caplog.text
    for damaged, message in [({**state["grad_scaler"], "scale": -1.0}, "positive number"),
                             ({**state["grad_scaler"], "scale": "big"}, "damaged"),
                             ({**state["grad_scaler"], "_growth_tracker": 1.5}, "non-negative integers"),
                             ([], "damaged")]:
        with pytest.raises(BertforgeError, match=message):
            stepper_for("fp16").load_state_dict({**state, "grad_scaler": damaged})


# ---------------------------------------------------------------------------------------------------- bf16
def test_bf16_loss_falls_and_weights_and_optimizer_state_stay_fp32():
    stepper = stepper_for("bf16", optimizer="adamw")
    losses = [step(stepper).totals["loss"].item() for _ in range(15)]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.3, losses
    assert stepper.skipped_steps == 0
    assert all(p.dtype == torch.float32 for p in stepper.model.parameters())
    state = stepper.optimizer.state_dict()["state"]
    assert all(t.dtype == torch.float32 for s in state.values() for k, t in s.items() if k != "step")
