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


def test_rmsnorm_equals_transformers_llama_rmsnorm():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from bertforge.model.parts import RMSNorm

    ours, ref = RMSNorm(16, 1e-6), LlamaRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ref.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 16) * 3
    assert torch.allclose(ours(x), ref(x), atol=1e-6) and [n for n, _ in ours.named_parameters()] == ["weight"]
    a, b = x.clone().requires_grad_(), x.clone().requires_grad_()  # the fused float32 kernel's gradients too
    (ours(a) ** 2).sum().backward()
    (ref(b) ** 2).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-5) and torch.allclose(ours.weight.grad, ref.weight.grad, atol=1e-4)
    assert ours.to(torch.bfloat16)(x.bfloat16()).dtype == torch.bfloat16  # a bf16 model stays bf16
    with pytest.raises(ValueError, match="no bias"):
        RMSNorm(16, 1e-6, bias=True)


def test_interleaved_rotary_equals_gpt_j_and_depends_on_distance_only():
    """Neighbouring pairs rotate together, as transformers' GPT-J rotates them (θ 10,000); q·k then depends on i - j
    alone, as the layouts need."""
    pytest.importorskip("transformers")
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    from bertforge.model.parts import ROTARIES, InterleavedRotary

    n, nh, L, hd = 2, 3, 7, 8
    q, k = torch.randn(n, nh, L, hd), torch.randn(n, nh, L, hd)
    ours_q, ours_k = ROTARIES["interleaved"](10_000.0, hd)(q, k)
    sin, cos = torch.split(create_sinusoidal_positions(L, hd)[None], hd // 2, dim=-1)  # [1, L, hd/2] each
    for ours, x in ((ours_q, q), (ours_k, k)):
        ref = apply_rotary_pos_emb(x.transpose(1, 2), sin, cos).transpose(1, 2)  # GPT-J's [n, L, nh, hd]
        assert torch.allclose(ours, ref, atol=1e-6)
    rotary = InterleavedRotary(500.0, hd)
    vec = torch.randn(hd)
    rows = vec.expand(1, 1, 12, hd)
    rq, rk = rotary(rows, rows)
    scores = rq[0, 0] @ rk[0, 0].T  # [12, 12]: the same vector at every position
    assert torch.allclose(scores.diagonal(3), scores.diagonal(3)[0].expand(9), atol=1e-5)
    assert not torch.allclose(ours_q, Rotary(10_000.0, hd)(q, k)[0])  # not the halves' layout


def test_rotary_tables_are_kept_and_equal_fresh_ones():
    """The kept table (built for the longest call so far) gives what computing the call's own table gives, and one
    built under inference mode still serves a training step's backward pass."""
    from bertforge.model.parts import InterleavedRotary, Rotary

    for cls in (Rotary, InterleavedRotary):
        rotary = cls(10_000.0, 8)
        with torch.inference_mode():
            rotary(torch.randn(1, 2, 300, 8), torch.randn(1, 2, 300, 8))  # keeps a 300-row table
        assert rotary._cache[torch.device("cpu")][0].shape[0] == 300
        q = torch.randn(2, 2, 37, 8, requires_grad=True)
        got = rotary(q, q)[0]
        fresh_cos, fresh_sin = rotary._tables(37, q.device)
        want = (rotary_reference(cls, q, fresh_cos, fresh_sin))
        assert torch.equal(got, want)
        got.sum().backward()
        assert q.grad is not None


def rotary_reference(cls, q, cos, sin):
    from bertforge.model.parts import InterleavedRotary, rotate, rotate_pairs

    return rotate_pairs(q, cos, sin) if cls is InterleavedRotary else rotate(q, cos, sin)
