"""`bertforge.core.ops`: every activation name is the reference formula, unknown names are refused, and `dropout` drops
a fraction p (within a statistical bar), scales the rest by 1/(1-p), and is the identity in eval mode or at p=0."""

from __future__ import annotations

import math

import pytest
import torch

from bertforge.core.ops import ACTIVATIONS, ACTIVATIONS_IN_PLACE, activation_fn, dropout


def gelu_erf(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


REFERENCE = {
    "gelu": gelu_erf,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "gelu_fast": gelu_tanh,
    "relu": lambda x: torch.clamp(x, min=0.0),
    "silu": lambda x: x * torch.sigmoid(x),
    "swish": lambda x: x * torch.sigmoid(x),
    "tanh": lambda x: (torch.exp(x) - torch.exp(-x)) / (torch.exp(x) + torch.exp(-x)),
}


def test_every_activation_has_a_reference_and_an_in_place_version():
    assert set(ACTIVATIONS) == set(REFERENCE) == set(ACTIVATIONS_IN_PLACE)


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_activation_matches_its_formula(name):
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    torch.testing.assert_close(activation_fn(name)(x), REFERENCE[name](x), rtol=1e-12, atol=1e-12)
    y = x.clone()
    out = activation_fn(name, in_place=True)(y)
    assert out.data_ptr() == y.data_ptr()  # overwrote its input
    torch.testing.assert_close(y, REFERENCE[name](x), rtol=1e-12, atol=1e-12)


def test_exact_and_tanh_gelu_differ():
    x = torch.linspace(-4, 4, 401, dtype=torch.float64)
    assert (activation_fn("gelu")(x) - activation_fn("gelu_new")(x)).abs().max() > 1e-5


def test_unknown_activation_names_the_choices():
    with pytest.raises(ValueError) as info:
        activation_fn("mish")
    message = str(info.value)
    assert "'mish'" in message and all(name in message for name in ACTIVATIONS)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_drops_a_fraction_p_and_scales_the_rest(p, dtype):
    torch.manual_seed(0)
    n = 200_000
    x = torch.full((n // 400, 400), 2.0, dtype=dtype)  # 2 dims: the mask must take x's shape
    y = dropout(x, p, training=True)
    assert y.shape == x.shape and y.dtype == dtype
    dropped = (y == 0).double().mean().item()
    assert abs(dropped - p) < 5 * math.sqrt(p * (1 - p) / n)  # 5 standard errors
    kept = y[y != 0].float()
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - p)), rtol=1e-2 if dtype == torch.bfloat16 else 1e-6,
                               atol=0)
    assert abs(y.float().mean().item() - 2.0) < 0.05  # expectation kept


def test_dropout_masks_differ_between_calls_and_elements():
    x = torch.ones(10_000)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    assert not torch.equal(a, b)
    # neighbouring elements are independent: pairs (even, odd) both dropped about p² of the time
    both = ((a[0::2] == 0) & (a[1::2] == 0)).double().mean().item()
    assert abs(both - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 5000)


def test_dropout_identity_in_eval_and_at_zero():
    x = torch.randn(64, 32)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0, training=True) is x


def test_dropout_edges_and_gradient():
    x = torch.randn(100, requires_grad=True)
    assert torch.equal(dropout(x, 1.0, True), torch.zeros(100))  # every element dropped
    y = dropout(x, 0.3, True)
    y.sum().backward()
    kept = y.detach() != 0
    torch.testing.assert_close(x.grad[kept], torch.full_like(x.grad[kept], 1 / 0.7))
    assert torch.all(x.grad[~kept] == 0)


def test_cpu_dropout_drops_p_and_scales_the_rest():
    from bertforge.core.ops import dropout

    torch.manual_seed(0)
    x = torch.rand(1001, 999) + 0.5  # odd size: the mask takes 32 bits of a 64-bit draw per element
    for p in (0.1, 0.5):
        x.requires_grad_(True)
        y = dropout(x, p, True)
        kept = y != 0
        frac = 1 - kept.float().mean().item()
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / x.numel()), (p, frac)
        torch.testing.assert_close(y[kept], x[kept] / (1 - p))
        y.sum().backward()
        torch.testing.assert_close(x.grad, kept.float() / (1 - p))
        x = x.detach()
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    assert torch.equal(dropout(x, 1.0, True), torch.zeros_like(x))  # F.dropout's edge case
    torch.manual_seed(3)
    a = dropout(x, 0.1, True)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.1, True))  # the global seed decides the mask
