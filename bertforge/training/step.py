"""The training step every trainer shares (pretraining, fine-tuning; later distillation and embedding training).

A trainer brings its model, its data and a `forward_backward(batch, weights)` that runs the model on one
micro-batch and hands its losses to `TrainStep.accumulate`; `TrainStep.run` does the rest of an optimizer step:
loss normalisation over micro-batches and ranks, gradient accumulation (DDP's `no_sync` on all but the last
micro-batch), clipping, skipping a non-finite step (counted), the optimizer and schedule steps. Its `step` and
`skipped_steps` are state a checkpoint saves (`state_dict` / `load_state_dict`). After `max_skipped_steps` skipped
steps in a row the run has diverged: `update` raises a BertforgeError rather than train on.

Mixed precision: bf16 autocast needs nothing more (its range is fp32's). fp16 autocast adds a gradient scaler
(`torch.amp.GradScaler`): the objective is multiplied by the loss scale before `.backward()`, the gradients are
unscaled before clipping, and a step whose gradients overflowed is skipped with the scale halved (it grows back
after 2000 clean steps). The weights and the optimizer state stay fp32. The scale is part of `state_dict`. `nonfinite_error`
refuses weights that are not finite, which a trainer checks before it saves a model.

This module is the only place in bertforge that calls `.backward(` and clips gradients (gradient caching, where a
loss is differentiated with respect to embeddings computed without grad and the gradients are pushed through each
mini-batch later, goes through `TrainStep.output_gradients` and `backward_from`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..model.checkpoint import nonfinite_tensors
from ..core.constants import IGNORE_INDEX
from ..core.errors import BertforgeError

log = logging.getLogger("bertforge")

Batch = dict[str, Tensor]
Counts = dict[str, int]  # loss term -> how many targets its mean is taken over, in one micro-batch
Weights = dict[str, float]  # loss term -> the factor its micro-batch mean gets in the step's objective

MAX_SKIPPED_STEPS = 10  # consecutive non-finite steps after which a run stops with an error (--max-skipped-steps)

# --precision of every trainer: its choices and its help, declared once
PRECISIONS = {"auto": None, "fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISION_HELP = ("auto: bf16 autocast where the hardware runs bf16 natively (a CUDA GPU with bf16; a CPU with "
                  "AVX512-BF16 or AMX), fp32 elsewhere; fp32; bf16 autocast; fp16 autocast with a gradient scaler "
                  "(loss scaling, overflowing steps skipped; for GPUs: a CPU emulates it, slowly)")


CPU_BF16 = "BERTFORGE_CPU_BF16"  # "0": take the CPU to have no bf16 units (auto trains in fp32 on it)


def cpu_bf16_units() -> str | None:
    """The CPU's native bf16 units ("AMX", "AVX512-BF16"), or None when it has none (and would emulate bf16, far
    slower than fp32) or BERTFORGE_CPU_BF16=0 says to act as if."""
    if os.environ.get(CPU_BF16) == "0":
        return None
    cpu = torch.cpu
    if getattr(cpu, "_is_amx_tile_supported", lambda: False)():
        return "AMX"
    if getattr(cpu, "_is_avx512_bf16_supported", lambda: False)():
        return "AVX512-BF16"
    return None


@dataclass(frozen=True)
class PrecisionChoice:
    """What `--precision` runs as (`dtype` None: fp32) and why, as a run's plan line says it."""

    dtype: torch.dtype | None
    reason: str

    @property
    def name(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(self.dtype, "fp32")  # type: ignore[arg-type]


def choose_precision(name: str, device: torch.device, training: bool = True) -> PrecisionChoice:
    """`--precision name` on `device`. auto: bf16 autocast on a CUDA GPU with bf16, and for training on a CPU with
    native bf16 units (`cpu_bf16_units`); fp32 elsewhere, and for inference on a CPU (exact interchange with
    transformers' fp32 numbers)."""
    check_precision(name)
    units = cpu_bf16_units() if device.type == "cpu" else None
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return PrecisionChoice(torch.bfloat16, "auto: the GPU runs bf16")
        if device.type == "cpu" and training and units is not None:
            return PrecisionChoice(torch.bfloat16, f"auto: the CPU has {units}")
        why = ("the CPU has no bf16 units (AVX512-BF16, AMX)" if device.type == "cpu" and training else
               "inference on the CPU stays fp32" if device.type == "cpu" else f"{device.type} without bf16")
        return PrecisionChoice(None, f"auto: {why}")
    dtype = PRECISIONS[name]
    if device.type == "cpu" and ((dtype is torch.bfloat16 and units is None) or dtype is torch.float16):
        log.warning("--precision %s on a CPU without %s units: emulated, slower than fp32", name,
                    "fp16" if dtype is torch.float16 else "bf16 (AVX512-BF16 or AMX)")
    return PrecisionChoice(dtype, f"--precision {name}")


def pick_precision(name: str, device: torch.device, training: bool = True) -> torch.dtype | None:
    """The autocast dtype of `choose_precision` (None: fp32)."""
    return choose_precision(name, device, training).dtype


def check_precision(name: Any) -> None:
    """Raise a BertforgeError unless `name` is one of PRECISIONS."""
    if not isinstance(name, str) or name not in PRECISIONS:
        raise BertforgeError(f"unknown --precision {name!r}; choose {', '.join(PRECISIONS)}")


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Autocast to `dtype` on `device`; nothing (fp32) when `dtype` is None."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def labelled_count(labels: Tensor) -> int:
    """How many targets a mean loss over `labels` averages: integer labels other than IGNORE_INDEX (MLM, NER,
    classification), every element of float labels (regression, multi-label)."""
    if labels.is_floating_point():
        return labels.numel()
    return int((labels != IGNORE_INDEX).sum())


@dataclass
class StepOutcome:
    totals: dict[str, Tensor]  # each micro-batch's stats summed (over ranks too when distributed)
    grad_norm: Tensor  # before clipping
    lr: float  # the learning rate this step used
    skipped: bool


class TrainStep:
    """One optimizer step over micro-batches, the same for every trainer.

    Normalisation: each loss term (say "mlm") of micro-batch m is the model's mean over its n_m targets (labelled
    tokens for MLM and NER, sequences for NSP and classification; counted by the trainer's `counts(batch)`). The
    step minimises Σ_m n_m / N · mean_m, N = Σ n_m over all micro-batches of all ranks (one all-reduce): the mean
    over every target of the step, exactly the loss of one big batch however the targets fall into micro-batches.
    Under DDP/FSDP, which average gradients over ranks, the objective is multiplied by the world size to undo it.
    A micro-batch without targets for a term (weight 0) leaves that term out, so its NaN mean changes nothing.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, *,
                 max_grad_norm: float = 1.0, device: torch.device | None = None, precision: torch.dtype | None = None,
                 world_size: int = 1, max_skipped_steps: int = MAX_SKIPPED_STEPS) -> None:
        if isinstance(max_skipped_steps, bool) or not isinstance(max_skipped_steps, int) or max_skipped_steps < 1:
            raise BertforgeError(f"--max-skipped-steps must be a positive integer, got {max_skipped_steps!r}")
        self.model = model  # the unwrapped module: its parameters are clipped
        self.optimizer, self.scheduler = optimizer, scheduler
        self.max_grad_norm = max_grad_norm
        self.device = device or torch.device("cpu")
        self.precision = precision
        self.world_size = world_size
        self.step = 0  # optimizer steps taken or skipped
        self.skipped_steps = 0  # every step without an update, fp16 overflows included
        self.consecutive_skipped = 0  # skipped steps in a row, up to the last step (fp16 overflows: see `update`)
        self.max_skipped_steps = max_skipped_steps
        # loss scaling under fp16 autocast; disabled (every call a no-op) otherwise
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=precision is torch.float16)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        return autocast(self.device, self.precision)

    def weights(self, counts: Sequence[Counts]) -> list[Weights]:
        """n_m / N for each micro-batch m and loss term, N summed over micro-batches and ranks."""
        keys = sorted({k for c in counts for k in c})
        totals = torch.tensor([float(sum(c.get(k, 0) for c in counts)) for k in keys], dtype=torch.float64)
        if self.world_size > 1:
            totals = totals.to(self.device)
            dist.all_reduce(totals)
        total = dict(zip(keys, totals.tolist()))
        return [{k: (c.get(k, 0) / total[k] if total[k] else 0.0) for k in keys} for c in counts]

    def accumulate(self, losses: dict[str, Tensor | None], weights: Weights) -> Tensor:
        """Backpropagate Σ_k weights[k] · losses[k]; returns that objective, detached (this micro-batch's share of
        the step's loss). Terms that are None or weigh 0 are left out."""
        terms = [loss * weights[k] for k, loss in losses.items() if loss is not None and weights.get(k)]
        if not terms:
            present = [loss for loss in losses.values() if loss is not None]
            if self.world_size > 1 and present:  # DDP all-reduces gradients in backward: a rank whose micro-batch
                # has no target (a stand-in, see `finetune.trainer.rank_share`) joins with zero gradients
                self.scaler.scale(sum(loss.sum() * 0.0 for loss in present)).backward()  # type: ignore[arg-type]  # a Tensor: present
            return torch.zeros((), device=self.device)
        objective = terms[0]
        for term in terms[1:]:
            objective = objective + term
        self.scaler.scale(objective * self.world_size if self.world_size > 1 else objective).backward()
        return objective.detach()

    def backward_from(self, outputs: Sequence[Tensor], grads: Sequence[Tensor], weight: float = 1.0) -> None:
        """Backpropagate gradients already known for `outputs` (d objective / d outputs, times `weight`) into the
        parameters: the second half of gradient caching (Gao et al., 2021), where a loss over a whole batch is
        differentiated with respect to its embeddings once (`output_gradients`) and each mini-batch is then re-run
        with grad and handed its share of those gradients here."""
        scale = weight * self.world_size if self.world_size > 1 else weight
        torch.autograd.backward(list(outputs), [self.scaler.scale(g * scale) for g in grads])

    @staticmethod
    def output_gradients(loss: Tensor, outputs: Sequence[Tensor]) -> list[Tensor]:
        """d loss / d outputs, the graph of `loss` freed: the first half of gradient caching (`backward_from`)."""
        return list(torch.autograd.grad(loss, list(outputs)))

    def run(self, batches: Sequence[Batch], forward_backward: Callable[[Batch, Weights], dict[str, Tensor]],
            counts: Callable[[Batch], Counts], wrapped: torch.nn.Module | None = None) -> StepOutcome:
        """Accumulate gradients over `batches` (`forward_backward` returns each one's stats, "loss" among them: its
        share of the step's loss), then clip, and update unless the loss or the gradient norm is not finite on some
        rank. `wrapped`: the DDP module whose `no_sync` skips the gradient all-reduce on all but the last batch."""
        self.optimizer.zero_grad(set_to_none=True)
        weights = self.weights([counts(b) for b in batches])
        totals: dict[str, Tensor] = {}
        for i, (batch, w) in enumerate(zip(batches, weights)):
            last = i == len(batches) - 1
            no_sync = self.world_size > 1 and not last and hasattr(wrapped, "no_sync")
            with wrapped.no_sync() if no_sync else contextlib.nullcontext():  # type: ignore[union-attr, operator]
                stats = forward_backward(batch, w)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0) + v
        return self.update(totals)

    def update(self, totals: dict[str, Tensor]) -> StepOutcome:
        """Unscale (fp16), clip, check, step the optimizer (or skip) and the schedule.

        A step is skipped when its loss or its gradient norm is not finite on some rank. Under fp16 a finite loss
        with overflowing gradients is the loss scale being too high: the step is skipped and counted like any
        other, the scale halves, and it does not count toward `max_skipped_steps` while the scale is still above
        1 (a run's first steps may overflow several times in a row before the scale settles)."""
        scaling = self.scaler.is_enabled() and any(p.grad is not None for p in self.model.parameters())
        if scaling:
            self.scaler.unscale_(self.optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        flags = torch.tensor([float(not torch.isfinite(totals["loss"])), float(not torch.isfinite(grad_norm))],
                             device=self.device)  # (bad loss, bad gradient)
        if self.world_size > 1:
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            for k in totals:
                dist.all_reduce(totals[k])
        bad_loss, bad_grad = (bool(f) for f in flags.tolist())
        skipped = bad_loss or bad_grad
        if skipped:
            overflow = scaling and not bad_loss and self.scaler.get_scale() > 1.0
            self.count_skipped(overflow)
        else:
            self.consecutive_skipped = 0
            if scaling:
                self.scaler.step(self.optimizer)  # the optimizer's step on the unscaled gradients
            else:
                self.optimizer.step()
        if scaling:
            self.update_scale(skipped)
        self.optimizer.zero_grad(set_to_none=True)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        self.step += 1
        return StepOutcome(totals, grad_norm, lr, skipped)

    def count_skipped(self, overflow: bool) -> None:
        """Count a skipped step; raise when `max_skipped_steps` in a row (fp16 overflows aside) say the run diverged."""
        self.skipped_steps += 1
        if overflow:
            log.info("step %d: fp16 gradients overflowed at loss scale %g; update skipped, scale halved",
                     self.step + 1, self.scaler.get_scale())
            return
        self.consecutive_skipped += 1
        log.warning("step %d: non-finite loss or gradient; update skipped (%d so far)", self.step + 1, self.skipped_steps)
        if self.consecutive_skipped >= self.max_skipped_steps:  # every rank took the same decision: all raise
            raise BertforgeError(
                f"training diverged: {self.consecutive_skipped} steps in a row (up to step {self.step + 1}) had a "
                f"non-finite loss or gradient, so none of them updated the model; lower the learning rate "
                f"(--lr), or raise --max-skipped-steps to tolerate more"
            )

    def update_scale(self, skipped: bool) -> None:
        """The scaler's end of step: grow the scale after `growth_interval` clean steps; on a skipped step, halve it
        and restart that count. The decision is the step's, taken over every rank, not the scaler's own inf check
        of this rank's gradients (under FSDP a rank sees only its shard), so every rank keeps the same scale."""
        if not skipped:
            self.scaler.update()  # no rank saw an inf: the scaler's own check agrees
            return
        state = self.scaler.state_dict()
        self.scaler.update()  # ends the scaler's iteration, whatever this rank's gradients held
        self.scaler.load_state_dict({**state, "scale": state["scale"] * state["backoff_factor"], "_growth_tracker": 0})

    def state_dict(self) -> dict[str, Any]:
        """The step counters and, under fp16, the loss scale: plain numbers (JSON or `weights_only` loads them)."""
        state: dict[str, Any] = {"step": self.step, "skipped_steps": self.skipped_steps,
                                 "consecutive_skipped": self.consecutive_skipped}
        if self.scaler.is_enabled():
            state["grad_scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.skipped_steps = state["step"], state["skipped_steps"]
        self.consecutive_skipped = int(state.get("consecutive_skipped", 0))  # absent in older checkpoints
        if not self.scaler.is_enabled():
            return  # a loss scale saved by an fp16 run has no use at another precision
        scaler = state.get("grad_scaler")
        if scaler is None:  # the run was not fp16 until now, or its checkpoint predates the scaler
            log.warning("the checkpoint holds no fp16 loss scale; starting from %g", self.scaler.get_scale())
            return
        self.scaler.load_state_dict(check_scaler_state(scaler))


def check_scaler_state(state: Any) -> dict[str, Any]:
    """A saved `GradScaler.state_dict()`, checked (a BertforgeError names what is wrong)."""
    numbers = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
    if not isinstance(state, dict) or not all(
        isinstance(state.get(k), (int, float)) and not isinstance(state.get(k), bool) for k in numbers
    ):
        raise BertforgeError(f"the saved fp16 loss-scale state is damaged: expected the numbers {', '.join(numbers)}")
    if not (math.isfinite(state["scale"]) and state["scale"] > 0):
        raise BertforgeError(f"the saved fp16 loss scale must be a positive number, got {state['scale']!r}")
    if not (isinstance(state["growth_interval"], int) and isinstance(state["_growth_tracker"], int)
            and state["growth_interval"] > 0 and state["_growth_tracker"] >= 0):
        raise BertforgeError("the saved fp16 loss-scale state is damaged: its growth interval and tracker must be "
                             "non-negative integers")
    return {k: state[k] for k in numbers}


def nonfinite_error(tensors: dict[str, Tensor], what: str) -> BertforgeError | None:
    """The error that refuses to save `what` (a path) when some weights of `tensors` are not finite; else None."""
    bad = nonfinite_tensors(tensors)
    if not bad:
        return None
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return BertforgeError(
        f"not saving {what}: the weights hold NaN or infinite values ({', '.join(bad[:3])}{more}); training "
        f"diverged: lower the learning rate (--lr)"
    )


def refuse_nonfinite(tensors: dict[str, Tensor], what: str) -> None:
    """Raise `nonfinite_error` rather than save `what` with weights that are not finite."""
    error = nonfinite_error(tensors, what)
    if error is not None:
        raise error
