"""StableAdamW (Wortsman et al., 2023) against its formula computed by hand in float64, and the warmup-stable-decay
schedule with ModernBERT's 1 - sqrt decay, values written out."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.training.optim import StableAdamW, make_optimizer, schedule_factor


def stable_adamw_reference(w, grads, lr, wd, b1, b2, eps, clip=True):
    """StableAdamW in float64: Adam's bias-corrected moments; RMS = sqrt(mean(g² / max(v_hat, eps²))) of this step's
    gradient over v_hat (this step included); rate = lr / max(1, RMS); w <- w (1 - rate wd) - rate m_hat /
    (sqrt(v_hat) + eps) (`clip` False: AdamW's rate, lr). Returns the weights and each step's RMS."""
    w = np.array(w, dtype=np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    rms_seen = []
    for t, g in enumerate(grads, start=1):
        g = np.array(g, dtype=np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        rms = math.sqrt(np.mean(g * g / np.maximum(v_hat, eps * eps)))
        rms_seen.append(rms)
        rate = lr / max(1.0, rms) if clip else lr
        w = w * (1 - rate * wd) - rate * m_hat / (np.sqrt(v_hat) + eps)
    return w, rms_seen


def test_stable_adamw_clips_a_spike_and_matches_the_formula():
    """Two quiet steps, then a gradient 30 times larger: its RMS over v_hat is above 1 (at most
    sqrt((1 - b2^t) / (1 - b2)), 1.7 at step 3 with b2 0.98), so that step's rate is divided by it; the quiet steps
    (RMS <= 1) are plain AdamW steps. Checked against the float64 formula."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(6, 5, generator=g)
    quiet = [torch.randn(6, 5, generator=g) * 0.01 for _ in range(2)]
    grads = [*quiet, torch.randn(6, 5, generator=g) * 0.3]
    lr, wd, b1, b2, eps = 0.01, 0.1, 0.9, 0.98, 1e-6
    p = nn.Parameter(w0.clone())
    opt = StableAdamW([{"params": [p], "weight_decay": wd}], lr=lr, betas=(b1, b2), eps=eps)
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
    want, rms = stable_adamw_reference(w0.numpy(), [x.numpy() for x in grads], lr, wd, b1, b2, eps)
    assert rms[0] == pytest.approx(1.0) and rms[1] < 1.0 and 1.5 < rms[2], rms  # the spike is clipped, not the rest
    np.testing.assert_allclose(p.detach().double().numpy(), want, rtol=1e-5, atol=1e-7)
    # AdamW (no clipping) ends elsewhere by far more than the tolerance: the test sees the clipping
    adamw, _ = stable_adamw_reference(w0.numpy(), [x.numpy() for x in grads], lr, wd, b1, b2, eps, clip=False)
    assert np.abs(adamw - want).max() > 1e-3


def test_make_optimizer_stable_adamw_decays_matrices_only_and_uses_its_betas():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    before = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    lr, wd, betas, eps = 0.05, 0.1, (0.8, 0.95), 1e-2
    opt = make_optimizer(model, "stable-adamw", lr=lr, weight_decay=wd, eps=eps, betas=betas)
    assert isinstance(opt, StableAdamW)
    g = torch.Generator().manual_seed(1)
    grads = {n: [] for n in before}
    for scale in (0.1, 0.1, 3.0):
        for n, p in model.named_parameters():
            p.grad = torch.randn(p.shape, generator=g) * scale
            grads[n].append(p.grad.double().numpy().copy())
        opt.step()
    for n, p in model.named_parameters():
        want, _ = stable_adamw_reference(before[n], grads[n], lr, wd if n == "0.weight" else 0.0, *betas, eps)
        np.testing.assert_allclose(p.detach().double().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=n)


def test_stable_adamw_state_round_trips():
    """The optimizer's state (moments, step) saves and loads like AdamW's: a restored optimizer steps the same."""
    torch.manual_seed(0)
    a, b = nn.Parameter(torch.randn(3, 2)), nn.Parameter(torch.zeros(3, 2))
    opt = StableAdamW([a], lr=0.1, weight_decay=0.01)
    a.grad = torch.randn(3, 2)
    opt.step()
    b.data.copy_(a.data)
    restored = StableAdamW([b], lr=0.1, weight_decay=0.01)
    restored.load_state_dict(copy.deepcopy(opt.state_dict()))  # as read back from a file: no shared tensors
    a.grad = b.grad = torch.randn(3, 2)
    opt.step()
    restored.step()
    assert torch.equal(a, b)


def test_wsd_sqrt_decays_as_one_minus_the_square_root_of_progress():
    """warmup 2, 20 steps, decay ratio 0.25: warmup at 0-1, the peak at 2-15, then 1 - sqrt((t - 15) / 5) over
    the last 5 steps, 0 from step 20 on. Values written out."""
    factor = schedule_factor(2, 20, "wsd-sqrt", 0.25)
    want = [0.5, 1.0] + [1.0] * 14 + [1 - math.sqrt(0.2), 1 - math.sqrt(0.4), 1 - math.sqrt(0.6), 1 - math.sqrt(0.8)]
    assert [factor(t) for t in range(20)] == pytest.approx(want, abs=1e-12)
    assert factor(20) == factor(25) == 0.0
    assert factor(16) == pytest.approx(0.5527864045, abs=1e-9)  # below wsd's linear 0.8 at the same step
