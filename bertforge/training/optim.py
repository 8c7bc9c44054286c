"""Optimizers and learning-rate schedules for every trainer: one construction (`make_optimizer`) and one schedule
(`warmup_decay`).

* Weight decay by dimension, not by name: matrices and embeddings (>= 2-D) decay, vectors (biases, LayerNorm
  weights) do not (`split_by_dimension`).
* Layer-wise learning-rate decay (`layer_decay_groups`): parameter groups by depth (the model's
  `parameter_depths`), each split by the same weight-decay rule.
* The optimizers (`OPTIMIZERS`): AdamW (PyTorch's fused kernel where it applies), StableAdamW and LAMB.
* The schedule: a linear warmup, then a decay that is linear, cosine, constant, or warmup-stable-decay (linear, or
  ModernBERT's 1 - sqrt); `set_schedule_length` refits it when a time budget changes the run's length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR

from ..core.errors import BertforgeError


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices and embeddings only; biases and LayerNorm weights (all 1-D) are not decayed."""
    return split_by_dimension([p for p in model.parameters() if p.requires_grad], weight_decay)


def split_by_dimension(params: list[Tensor], weight_decay: float) -> list[dict]:
    """The weight-decay rule: [decayed matrices and embeddings (>= 2-D), undecayed vectors (1-D)]."""
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def check_layer_lr_decay(value: object) -> None:
    """Refuse a layer-wise learning-rate decay factor outside (0, 1] (1: no decay)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise BertforgeError(f"layer_lr_decay must be a number in (0, 1] (1: off), got {value!r}")


def layer_decay_groups(model: nn.Module, lr: float, weight_decay: float, layer_lr_decay: float) -> list[dict]:
    """`parameter_groups` with layer-wise learning-rate decay (ELECTRA, DeBERTa fine-tuning): parameters at depth d
    (see `BertPreTrainedModel.parameter_depths`) get `lr * layer_lr_decay ** (L + 1 - d)`: the head and pooler `lr`, the top block
    `lr * F`, the next `lr * F**2`, ..., the embeddings `lr * F**(L + 1)`. Each depth is split by the same
    weight-decay rule; the schedule multiplies every group's rate alike. The head's groups come first (the rate a
    training log reports is the first group's). Frozen parameters (requires_grad False) are left out."""
    check_layer_lr_decay(layer_lr_decay)
    blocks, depth = model.parameter_depths()  # type: ignore[operator]
    by_depth: dict[int, list[Tensor]] = {}
    for param in model.parameters():
        if param.requires_grad:
            by_depth.setdefault(depth.get(id(param), blocks + 1), []).append(param)
    groups = []
    for d in sorted(by_depth, reverse=True):
        rate = lr * layer_lr_decay ** (blocks + 1 - d)
        groups += [{**g, "lr": rate} for g in split_by_dimension(by_depth[d], weight_decay) if g["params"]]
    return groups


class AdamMoments(torch.optim.Optimizer):
    """Adam's moments, kept in float32 per parameter (m, v and the step count t), for the optimizers below that
    differ from AdamW only in how a tensor's update is scaled: each `apply(p, group, grad, m̂, v̂)`."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-6, weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                t = state["step"].item()
                grad, m, v = p.grad.float(), state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(grad, 1 - beta1)
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                self.apply(p, group, grad, m / (1 - beta1**t), v / (1 - beta2**t))
        return loss

    def apply(self, p: Tensor, group: dict, grad: Tensor, m_hat: Tensor, v_hat: Tensor) -> None:
        raise NotImplementedError


class Lamb(AdamMoments):
    """LAMB (You et al., 2019): Adam's update rescaled per tensor by ‖w‖ / ‖update‖, for very large batches."""

    def apply(self, p: Tensor, group: dict, grad: Tensor, m_hat: Tensor, v_hat: Tensor) -> None:
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if group["weight_decay"]:
            update.add_(p, alpha=group["weight_decay"])
        w_norm, u_norm = p.norm(), update.norm()
        trust = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        p.sub_((update * trust * group["lr"]).to(p.dtype))


class StableAdamW(AdamMoments):
    """AdamW with per-tensor update clipping (Wortsman et al., 2023; ModernBERT's optimizer): each tensor's step
    size is lr / max(1, RMS), RMS = sqrt(mean(g² / max(v̂, eps²))) of this step's gradient g over its bias-corrected
    second-moment estimate v̂ (this step's included), so that a gradient far above what v̂ expects (a spike after a
    quiet stretch) cannot make a huge update; decoupled weight decay uses the same clipped rate. Otherwise the
    update is AdamW's: p ← p·(1 - η·wd) - η · m̂ / (sqrt(v̂) + eps)."""

    def apply(self, p: Tensor, group: dict, grad: Tensor, m_hat: Tensor, v_hat: Tensor) -> None:
        eps = group["eps"]
        rms = (grad.square() / v_hat.clamp(min=eps * eps)).mean().sqrt()
        rate = group["lr"] / rms.clamp(min=1.0)  # a tensor: no device sync per parameter
        update = m_hat / (v_hat.sqrt() + eps)
        if group["weight_decay"]:
            p.mul_((1 - rate * group["weight_decay"]).to(p.dtype))
        p.sub_((update * rate).to(p.dtype))


OPTIMIZERS = ("adamw", "stable-adamw", "lamb")  # `make_optimizer`'s names


def fused_adamw_supported(params: list[Tensor]) -> bool:
    """Whether PyTorch's fused AdamW kernel takes these parameters: plain (not sharded) floating-point tensors on
    CPU or CUDA. It is the same update as the for-loop one, in one pass over memory: on 2 CPU cores it steps
    BERT-base's 110 M parameters in ~0.2 s where the for-loop AdamW's hundreds of small parallel regions take
    seconds as soon as the machine is loaded."""
    from torch.distributed.tensor import DTensor

    return bool(params) and all(
        p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point and not isinstance(p, DTensor) for p in params
    )


# epsilon and betas of the BERT paper's optimizer (fine-tuning passes transformers' epsilon, 1e-8)
BERT_EPS = 1e-6
BETAS = (0.9, 0.999)


def make_optimizer(
    model: nn.Module, name: str, lr: float, weight_decay: float, fused: bool | None = None, eps: float = BERT_EPS,
    betas: tuple[float, float] = BETAS, layer_lr_decay: float = 1.0,
) -> torch.optim.Optimizer:
    """AdamW, StableAdamW or LAMB (`OPTIMIZERS`) over `parameter_groups` (`betas`, by default (0.9, 0.999); epsilon `eps`): the one optimizer
    construction of every trainer. `fused=None`: PyTorch's fused AdamW kernel wherever it applies (see
    `fused_adamw_supported`). `layer_lr_decay` < 1: the groups of `layer_decay_groups` instead (a model with a
    `base_model` encoder)."""
    check_layer_lr_decay(layer_lr_decay)
    if layer_lr_decay == 1:
        groups = parameter_groups(model, weight_decay)
    else:
        groups = layer_decay_groups(model, lr, weight_decay, layer_lr_decay)
    if name == "adamw":
        kwargs: dict[str, Any] = dict(lr=lr, betas=betas, eps=eps)
        if fused is None:
            fused = fused_adamw_supported([p for g in groups for p in g["params"]])
        if fused:
            kwargs["fused"] = True
        return torch.optim.AdamW(groups, **kwargs)
    if name == "stable-adamw":
        return StableAdamW(groups, lr=lr, betas=betas, eps=eps)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps)
    raise BertforgeError(f"unknown optimizer {name!r}; choose {', '.join(OPTIMIZERS)}")


DECAYS = ("linear", "cosine", "constant", "wsd", "wsd-sqrt")
STABLE_DECAYS = ("wsd", "wsd-sqrt")  # warmup-stable-decay: the peak until the last `decay_ratio` of the run


def warmup_decay(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int, decay: str = "linear",
                 decay_ratio: float = 0.1) -> LambdaLR:
    """Linear warmup to the peak over `warmup_steps`, then the `decay` to 0 at `total_steps`: the one schedule of
    every trainer. Step s < w (0-based) runs at (s + 1) / w of the peak, so the first update is not wasted at
    learning rate 0 and step w - 1 reaches the peak.

    linear / cosine: from the peak at step w down to 0 at `total_steps`. constant: the peak to the end (and
    beyond). wsd (warmup-stable-decay): the peak until the last `decay_ratio` of the run (round(decay_ratio x
    total_steps) steps, at most what the warmup leaves), then linearly to 0 at `total_steps`; wsd-sqrt: the same with
    ModernBERT's 1 - sqrt(progress) decay (it leaves the peak faster and ends lower sooner)."""
    return LambdaLR(optimizer, schedule_factor(warmup_steps, total_steps, decay, decay_ratio))


def decay_start(warmup_steps: int, total_steps: int, decay: str = "linear", decay_ratio: float = 0.1) -> int:
    """The first step whose learning rate depends on `total_steps` (the decay's start; `total_steps` for
    constant): before it, a run may still change its length without changing any learning rate."""
    if decay == "constant":
        return total_steps
    if decay in STABLE_DECAYS:
        return max(warmup_steps, total_steps - round(decay_ratio * total_steps))
    return warmup_steps


def schedule_factor(warmup_steps: int, total_steps: int, decay: str = "linear",
                    decay_ratio: float = 0.1) -> Callable[[int], float]:
    """`warmup_decay`'s multiplier of the peak learning rate at each (0-based) step."""
    if decay not in DECAYS:
        raise BertforgeError(f"unknown learning-rate decay {decay!r}; choose {', '.join(DECAYS)}")
    if not 0 < decay_ratio <= 1:
        raise BertforgeError(f"--decay-ratio must be in (0, 1], got {decay_ratio}")
    decay_from = decay_start(warmup_steps, total_steps, decay, decay_ratio)  # where the decay to 0 starts

    def factor(step: int) -> float:
        if decay != "constant" and step >= total_steps:
            return 0.0  # the run is over (also when the warmup covers every step)
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        if decay == "constant" or step < decay_from:
            return 1.0
        progress = min(1.0, (step - decay_from) / max(1, total_steps - decay_from))
        if decay == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if decay == "wsd-sqrt":
            return 1.0 - math.sqrt(progress)
        return 1.0 - progress  # linear, and the decay of wsd

    return factor


def set_schedule_length(scheduler: LambdaLR, warmup_steps: int, total_steps: int, decay: str = "linear",
                        decay_ratio: float = 0.1) -> None:
    """Give a `warmup_decay` schedule a new length (a run limited by wall time learns its length as it goes):
    the steps from now on follow the schedule of `total_steps`; the learning rate of the next step is set now."""
    factor = schedule_factor(warmup_steps, total_steps, decay, decay_ratio)
    scheduler.lr_lambdas = [factor] * len(scheduler.optimizer.param_groups)
    for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
        group["lr"] = base * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]
