"""LAMB against the formulas of You et al. (2019), computed by hand in float64; parameter groups; schedules."""

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.optim import Lamb, make_optimizer, parameter_groups

B1, B2, EPS = 0.9, 0.999, 1e-6


def lamb_reference(w, grads, lr, wd, b1=B1, b2=B2, eps=EPS):
    """LAMB by the paper, in float64: Adam moments with bias correction, r = m_hat / (sqrt(v_hat) + eps) + wd * w,
    trust ratio ||w|| / ||r|| (1 when either norm is 0), w <- w - lr * trust * r; one step per gradient."""
    w = np.array(w, dtype=np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = np.array(g, dtype=np.float64)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        r = m_hat / (np.sqrt(v_hat) + eps) + wd * w
        w_norm, r_norm = np.linalg.norm(w), np.linalg.norm(r)
        trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
        w = w - lr * trust * r
    return w


def run_lamb(params_and_grads, groups_wd, lr, steps=1):
    """Lamb over one group per (tensor, weight decay); returns the tensors after `steps` steps."""
    params = [nn.Parameter(torch.tensor(w, dtype=torch.float32)) for w, _ in params_and_grads]
    opt = Lamb([{"params": [p], "weight_decay": wd} for p, wd in zip(params, groups_wd)], lr=lr, eps=EPS)
    for step in range(steps):
        for p, (_, grads) in zip(params, params_and_grads):
            p.grad = torch.tensor(grads[step], dtype=torch.float32)
        opt.step()
    return [p.detach().double().numpy() for p in params]


def test_one_lamb_step_matches_the_paper():
    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(3, 4))
    vector = rng.normal(size=5)
    g_matrix, g_vector = rng.normal(size=(3, 4)), rng.normal(size=5) * 1e-3  # tiny gradient: eps matters a little
    lr, wd = 0.1, 0.01
    got = run_lamb([(matrix, [g_matrix]), (vector, [g_vector])], [wd, 0.0], lr)
    want = [lamb_reference(matrix, [g_matrix], lr, wd), lamb_reference(vector, [g_vector], lr, 0.0)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # the step really moved the weights, by lr * ||w|| in norm for the undecayed vector (the trust ratio at work)
    assert np.linalg.norm(got[1] - vector) == pytest.approx(lr * np.linalg.norm(vector), rel=1e-4)


def test_three_lamb_steps_match_the_paper_with_bias_correction():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(4, 4))
    grads = [rng.normal(size=(4, 4)) for _ in range(3)]
    (got,) = run_lamb([(w, grads)], [0.05], lr=0.02, steps=3)
    np.testing.assert_allclose(got, lamb_reference(w, grads, 0.02, 0.05), rtol=1e-5, atol=1e-6)


def test_trust_ratio_is_one_when_a_norm_is_zero():
    g = np.array([0.5, -1.0, 2.0])
    # zero weights: ||w|| = 0, trust 1, a plain Adam step of lr * sign-ish(g)
    (got,) = run_lamb([(np.zeros(3), [g])], [0.0], lr=0.1)
    np.testing.assert_allclose(got, lamb_reference(np.zeros(3), [g], 0.1, 0.0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, -0.1 * g / (np.abs(g) + EPS), rtol=1e-5)
    # zero gradient and no decay: ||r|| = 0, nothing moves (and no NaN from 0 / 0)
    w = np.array([1.0, 2.0, 3.0])
    (same,) = run_lamb([(w, [np.zeros(3)])], [0.0], lr=0.1)
    np.testing.assert_array_equal(same, w.astype(np.float32))


def test_make_optimizer_lamb_excludes_biases_and_layernorm_from_decay():
    torch.manual_seed(0)
    model = nn.ModuleList([nn.Linear(4, 3), nn.LayerNorm(3), nn.Linear(2, 2).requires_grad_(False)])
    groups = parameter_groups(model, 0.1)
    assert [len(g["params"]) for g in groups] == [1, 3] and [g["weight_decay"] for g in groups] == [0.1, 0.0]
    before = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    opt = make_optimizer(model, "lamb", lr=0.05, weight_decay=0.1)
    assert isinstance(opt, Lamb)
    model[1](model[0](torch.randn(5, 4))).pow(3).sum().backward()
    grads = {n: p.grad.double().numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    decayed = {"0.weight"}
    for name, p in model.named_parameters():
        if name.startswith("2."):  # frozen: not in any group, untouched
            np.testing.assert_array_equal(p.detach().numpy(), before[name])
            continue
        wd = 0.1 if name in decayed else 0.0
        want = lamb_reference(before[name], [grads[name]], 0.05, wd)
        np.testing.assert_allclose(p.detach().double().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=name)
    # with decay on every tensor the LayerNorm weight would have moved differently: the exclusion is visible
    ln_decayed = lamb_reference(before["1.weight"], [grads["1.weight"]], 0.05, 0.1)
    assert not np.allclose(model[1].weight.detach().double().numpy(), ln_decayed, rtol=1e-6, atol=1e-9)
