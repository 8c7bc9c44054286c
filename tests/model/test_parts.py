"""The parts against their definitions: a LayerNorm without bias, rotary positions, relative-position buckets."""

import math

import pytest
import torch
import torch.nn.functional as F

from bertforge.model import LayerNorm, RelativeAttention
from bertforge.model.parts import Dense, Rotary, relative_positions


def test_layernorm_without_bias_has_no_bias_parameter():
    norm = LayerNorm(8, 1e-5, bias=False)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 8)
    assert torch.allclose(norm(x), F.layer_norm(x, (8,), norm.weight, None, 1e-5))


def test_dense_without_bias_and_with_an_activation():
    dense = Dense(5, 4, bias=False, act="gelu")
    torch.nn.init.normal_(dense.weight)
    x = torch.randn(2, 5)
    assert dense.bias is None and torch.allclose(dense(x), F.gelu(x @ dense.weight.T), atol=1e-6)


def test_rotary_rotates_each_half_pair_by_position_times_frequency():
    hd, theta = 8, 10_000.0
    q, k = torch.randn(1, 2, 6, hd), torch.randn(1, 2, 6, hd)
    rq, rk = Rotary(theta, hd)(q, k)
    p, j = 4, 1  # position 4, frequency index 1: (x_j, x_{j + hd/2}) turned by p · θ^(-2j/hd)
    angle = p * theta ** (-2 * j / hd)
    a, b = q[0, 0, p, j], q[0, 0, p, j + hd // 2]
    assert math.isclose(rq[0, 0, p, j].item(), (a * math.cos(angle) - b * math.sin(angle)).item(), abs_tol=1e-5)
    assert math.isclose(rq[0, 0, p, j + hd // 2].item(), (b * math.cos(angle) + a * math.sin(angle)).item(), abs_tol=1e-5)
    assert torch.allclose(rq[..., 0, :], q[..., 0, :])  # position 0 is not turned


def test_rotary_scores_depend_only_on_the_distance():
    hd = 16
    x = torch.randn(1, 1, 1, hd).expand(1, 1, 12, hd)  # the same vector at every position
    y = torch.randn(1, 1, 1, hd).expand(1, 1, 12, hd)
    rq, rk = Rotary(160_000.0, hd)(x, y)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    for d in range(-3, 4):
        diag = torch.diagonal(scores, offset=d)
        assert torch.allclose(diag, diag[0].expand_as(diag), atol=1e-4)


@pytest.mark.parametrize("L", [1, 2, 40])
@pytest.mark.parametrize("buckets, max_distance", [(8, 16), (256, 512), (0, 4)])
def test_relative_positions_follow_the_log_bucket_formula(buckets, max_distance, L):
    """Every (i, j) of the [L, L] index (built from the 2L - 1 distances: a Toeplitz matrix), by the formula."""
    rel = RelativeAttention(buckets=buckets, max_distance=max_distance)
    got = relative_positions(L, rel)
    assert got.shape == (L, L) and got.is_contiguous() and got.dtype == torch.int64
    span = rel.span
    for i in range(L):
        for j in range(L):
            r = i - j
            if buckets == 0:
                want = r
            else:
                mid = buckets // 2
                if abs(r) <= mid:
                    want = r
                else:
                    scaled = math.log(abs(r) / mid) / math.log((max_distance - 1) / mid) * (mid - 1)
                    want = int(math.copysign(math.ceil(scaled) + mid, r))
            assert got[i, j] == min(max(want + span, 0), 2 * span - 1), (i, j)
