"""LAMB against the formulas of You et al. (2019), computed by hand in float64; parameter groups; schedules."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from bertforge.training.optim import Lamb, make_optimizer, parameter_groups

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


# ---------------------------------------------------------------------------------------------------- schedules
def schedule_factor(t: int, warmup: int, total: int, decay: str) -> float:
    """The schedule, written out: optimizer step t (0-based) runs at peak x this. Warmup climbs linearly in equal
    steps of 1/warmup and reaches the peak on its last step (t = warmup - 1): (t + 1) / warmup, so that no step is
    wasted at lr 0. From t = warmup the decay starts at the peak, with progress p = (t - warmup) / (total - warmup)
    capped at 1: linear 1 - p, cosine (1 + cos(pi p)) / 2, constant 1; both decays reach 0 at t = total."""
    if t < warmup:
        return (t + 1) / warmup
    p = min(1.0, (t - warmup) / (total - warmup))
    return {"linear": 1.0 - p, "cosine": 0.5 * (1.0 + math.cos(math.pi * p)), "constant": 1.0}[decay]


def schedule_lrs(peak: float, warmup: int, total: int, decay: str, steps: int) -> list[float]:
    """The learning rate optimizer step t runs at, for t in range(steps), as the trainers use the scheduler (the
    rate is read, the optimizer steps, then the scheduler steps)."""
    from bertforge.training.optim import warmup_decay

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    sched = warmup_decay(opt, warmup, total, decay)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        assert sched.get_last_lr()[0] == opt.param_groups[0]["lr"]
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("decay", ["linear", "cosine", "constant"])
def test_schedule_at_the_boundary_steps(decay):
    peak, warmup, total = 0.1, 4, 14  # decay over steps 4..14: its middle is step 9
    lrs = schedule_lrs(peak, warmup, total, decay, total + 3)
    for t, lr in enumerate(lrs):
        assert lr == pytest.approx(peak * schedule_factor(t, warmup, total, decay), rel=1e-12, abs=1e-15), (t, lr)
    # the boundary steps by value, not through the formula above
    assert lrs[0] == pytest.approx(0.025)  # first warmup step: peak / warmup, not 0
    assert lrs[1] == pytest.approx(0.05) and lrs[2] == pytest.approx(0.075)
    assert lrs[3] == pytest.approx(0.1)  # warmup - 1: the peak
    assert lrs[4] == pytest.approx(0.1)  # warmup: the decay starts from the peak
    after, middle, end = {"linear": (0.09, 0.05, 0.0), "cosine": (0.1 * (1 + 0.9510565162951535) / 2, 0.05, 0.0),
                          "constant": (0.1, 0.1, 0.1)}[decay]  # cos(pi / 10) = 0.951..
    assert lrs[5] == pytest.approx(after)  # warmup + 1
    assert lrs[9] == pytest.approx(middle)  # the middle of the decay
    assert lrs[14] == pytest.approx(end, abs=1e-15) and lrs[16] == pytest.approx(end, abs=1e-15)  # total, and past it
    if decay != "constant":
        assert all(a > b for a, b in zip(lrs[4:14], lrs[5:15])), "strictly decreasing from warmup to total"
        step7 = 0.1 * (1 + math.cos(math.pi * 0.3)) / 2 if decay == "cosine" else 0.07  # progress 0.3
        assert lrs[7] == pytest.approx(step7)


def test_schedule_without_warmup_starts_at_the_peak():
    for decay in ("linear", "cosine", "constant"):
        lrs = schedule_lrs(0.2, 0, 10, decay, 11)
        assert lrs[0] == pytest.approx(0.2), decay
        for t, lr in enumerate(lrs):
            assert lr == pytest.approx(0.2 * schedule_factor(t, 0, 10, decay), abs=1e-15), (decay, t)
    assert schedule_lrs(0.2, 0, 10, "linear", 11)[5] == pytest.approx(0.1)


def test_schedule_warmup_covering_the_whole_run():
    """warmup == total: the run is all warmup and never decays (the decay's span would be 0)."""
    lrs = schedule_lrs(1.0, 5, 5, "linear", 5)
    assert lrs == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_unknown_decay_is_refused():
    from bertforge import BertforgeError
    from bertforge.training.optim import warmup_decay

    with pytest.raises(BertforgeError, match="linear, cosine, constant, wsd"):
        warmup_decay(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 1, 10, "cosin")
    for ratio in (0.0, -0.1, 1.5):
        with pytest.raises(BertforgeError, match="--decay-ratio"):
            warmup_decay(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 1, 10, "wsd", ratio)


def schedule_lrs_wsd(peak: float, warmup: int, total: int, ratio: float, steps: int) -> list[float]:
    from bertforge.training.optim import warmup_decay

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=peak)
    sched = warmup_decay(opt, warmup, total, "wsd", ratio)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_wsd_schedule_is_warmup_then_the_peak_then_a_linear_decay_over_the_last_fraction():
    """warmup 2, 20 steps, decay ratio 0.25: warmup at steps 0-1, the peak at 2-14, then 1 - (t - 15) / 5 over the
    last 5 steps (15-19), 0 from step 20 on. Values written out, not computed from the schedule's own formula."""
    lrs = schedule_lrs_wsd(1.0, 2, 20, 0.25, 23)
    want = [0.5, 1.0] + [1.0] * 13 + [1.0, 0.8, 0.6, 0.4, 0.2] + [0.0] * 3
    assert lrs == pytest.approx(want, abs=1e-12)


def test_wsd_decay_never_starts_inside_the_warmup():
    """A decay span longer than what the warmup leaves: the decay starts when the warmup ends (step 8 of 10)."""
    lrs = schedule_lrs_wsd(1.0, 8, 10, 0.5, 11)
    assert lrs == pytest.approx([0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, 1.0, 0.5, 0.0], abs=1e-12)
    # the default ratio 0.1 of a 100-step run without warmup: the peak for 90 steps, then down by a tenth each step
    lrs = schedule_lrs_wsd(1.0, 0, 100, 0.1, 101)
    assert lrs[:91] == pytest.approx([1.0] * 91) and lrs[91] == pytest.approx(0.9) and lrs[99] == pytest.approx(0.1)
    assert lrs[100] == 0.0


# ------------------------------------------------------------------------------- layer-wise learning-rate decay
def _rates(groups):
    """Each parameter's (learning rate, weight decay) in `groups`, by id; every parameter in one group only."""
    seen = {}
    for g in groups:
        for p in g["params"]:
            assert id(p) not in seen
            seen[id(p)] = (g["lr"], g["weight_decay"])
    return seen


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_layer_decay_groups_give_each_depth_its_rate(family):
    from bertforge import AutoModelForSequenceClassification, BertConfig
    from bertforge.training.optim import layer_decay_groups

    model = AutoModelForSequenceClassification.from_config(
        BertConfig.preset(f"{family}-tiny", num_hidden_layers=3, vocab_size=50, num_labels=2))
    lr, f, wd = 1e-3, 0.5, 0.01
    groups = layer_decay_groups(model, lr, wd, f)
    rates = _rates(groups)
    expected = {}
    for name, p in model.named_parameters():
        if name.startswith("bert.embeddings."):
            depth = 0
        elif name.startswith("bert.encoder.layer."):
            depth = int(name.split(".")[3]) + 1
        else:  # the head, and BERT's pooler with it
            assert name.startswith(("classifier.", "bert.pooler."))
            depth = 4
        expected[id(p)] = (lr * f ** (4 - depth), wd if p.dim() >= 2 else 0.0)
    assert rates == expected  # the same product of floats on both sides
    assert groups[0]["lr"] == lr  # the head first: the rate the training log reports
    assert sorted({g["lr"] for g in groups}) == pytest.approx([lr * f**k for k in (4, 3, 2, 1, 0)])
    assert _rates(make_optimizer(model, "adamw", lr, wd, layer_lr_decay=f).param_groups) == expected


def test_layer_decay_albert_shared_layer_takes_the_top_blocks_rate():
    from bertforge import AutoModelForSequenceClassification, BertConfig
    from bertforge.training.optim import layer_decay_groups

    config = BertConfig.preset("albert-tiny", num_hidden_layers=3, vocab_size=50, num_labels=2)
    model = AutoModelForSequenceClassification.from_config(config)
    assert len(model.bert.encoder.layer) == 1 and model.bert.encoder.embedding_projection is not None
    rates = _rates(layer_decay_groups(model, 1.0, 0.0, 0.5))
    names = dict(model.named_parameters())
    for name, p in names.items():
        want = 0.5 if name.startswith("bert.encoder.layer.0.") else 0.5**4 if name.startswith(
            ("bert.embeddings.", "bert.encoder.embedding_projection.")) else 1.0
        assert rates[id(p)][0] == want, name


def test_layer_decay_leaves_frozen_parameters_out_and_the_schedule_scales_every_group():
    from bertforge import BertForSequenceClassification, BertConfig
    from bertforge.training.optim import layer_decay_groups, warmup_decay

    model = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=50, num_labels=2))
    model.bert.embeddings.requires_grad_(False)
    groups = layer_decay_groups(model, 1e-3, 0.0, 0.8)
    assert not {id(p) for p in model.bert.embeddings.parameters()} & set(_rates(groups))
    assert min(g["lr"] for g in groups) == pytest.approx(1e-3 * 0.8**2)  # the embeddings' 0.8**3 is gone
    optimizer = make_optimizer(model, "adamw", 1e-3, 0.0, layer_lr_decay=0.8)
    peaks = [g["lr"] for g in optimizer.param_groups]
    scheduler = warmup_decay(optimizer, 4, 10)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([p * 3 / 4 for p in peaks])  # step 2 of 4


def test_layer_decay_one_is_the_plain_groups_and_bad_factors_are_refused():
    from bertforge import BertForSequenceClassification, BertConfig
    from bertforge.core.errors import BertforgeError

    model = BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=50, num_labels=2))
    plain = make_optimizer(model, "adamw", 1e-3, 0.1, layer_lr_decay=1.0).param_groups
    assert [(len(g["params"]), g["weight_decay"]) for g in plain] == [
        (len(g["params"]), g["weight_decay"]) for g in parameter_groups(model, 0.1)]
    for bad in (0, 0.0, -0.5, 1.5, float("nan"), True, "0.9", None):
        with pytest.raises(BertforgeError, match=r"layer_lr_decay must be a number in \(0, 1\]"):
            make_optimizer(model, "adamw", 1e-3, 0.1, layer_lr_decay=bad)


# ------------------------------------------------------------------------------------- AdamW, written out
def adamw_reference(w, grads, lr, wd, b1, b2, eps):
    """AdamW (Loshchilov & Hutter) in float64: w <- w - lr * wd * w (decoupled decay), then the Adam step with bias
    correction, w <- w - lr * m_hat / (sqrt(v_hat) + eps)."""
    w = np.array(w, dtype=np.float64)
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = np.array(g, dtype=np.float64)
        w = w - lr * wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return w


@pytest.mark.parametrize("name,fused", [("adamw", None), ("adamw", False), ("lamb", None)])
def test_make_optimizer_steps_by_the_formula_with_the_betas_and_epsilon_it_is_given(name, fused):
    """Three steps of `make_optimizer`'s optimizer (fused AdamW where PyTorch has it, the for-loop one, LAMB) against
    the formula with betas (0.8, 0.95) and epsilon 0.01, far enough from the defaults that dropping either shows;
    matrices decayed, vectors not."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    before = {n: p.detach().double().numpy().copy() for n, p in model.named_parameters()}
    lr, wd, betas, eps = 0.05, 0.1, (0.8, 0.95), 1e-2
    opt = make_optimizer(model, name, lr=lr, weight_decay=wd, fused=fused, eps=eps, betas=betas)
    g = torch.Generator().manual_seed(1)
    grads = {n: [] for n in before}
    for _ in range(3):
        for n, p in model.named_parameters():
            p.grad = torch.randn(p.shape, generator=g) * 0.1
            grads[n].append(p.grad.double().numpy().copy())
        opt.step()
    reference = adamw_reference if name == "adamw" else lamb_reference
    for n, p in model.named_parameters():
        decay = wd if n == "0.weight" else 0.0
        want = reference(before[n], grads[n], lr, decay, *betas, eps) if name == "adamw" else \
            reference(before[n], grads[n], lr, decay, b1=betas[0], b2=betas[1], eps=eps)
        np.testing.assert_allclose(p.detach().double().numpy(), want, rtol=1e-5, atol=1e-6, err_msg=n)


@pytest.mark.parametrize("decay", ["wsd", "wsd-sqrt"])
def test_a_wsd_schedule_given_a_new_length_decays_over_the_new_runs_last_fraction(decay):
    """A run limited by wall time learns its length as it goes (`set_schedule_length`): after 5 steps of a 20-step
    plan the run becomes 40 steps; from then on the learning rates are those of a 40-step WSD schedule, the peak
    until step 36 (40 - 0.1 · 40) and the decay's shape over the last 4 steps. Values written out."""
    from bertforge.training.optim import set_schedule_length, warmup_decay

    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_decay(opt, 2, 20, decay, 0.1)
    lrs = []
    for step in range(42):
        if step == 5:
            set_schedule_length(sched, 2, 40, decay, 0.1)
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    shape = [1.0, 0.75, 0.5, 0.25] if decay == "wsd" else [1.0, 0.5, 1 - math.sqrt(0.5), 1 - math.sqrt(0.75)]
    want = [1.0, 2.0] + [2.0] * 34 + [2.0 * f for f in shape] + [0.0, 0.0]
    assert lrs == pytest.approx(want, abs=1e-12)
