"""`bertforge.model.attention`: the one attention function and the three layouts (padded, unpadded, packed) give the same
results for the real tokens of every sequence."""

from __future__ import annotations

import pytest
import torch

import bertforge
from bertforge import BertConfig
from bertforge.model import attention
from bertforge.model.attention import Padded, Unpadded, attend, attention_plan, extended_attention_mask, length_groups, pack
from bertforge.core.linear import linear_backend

SDPA_ONLY = {"one thread": 0, "threads": 0}  # MATMUL_ATTENTION_MAX_LENGTH with no sequence short enough for matmuls


@pytest.mark.parametrize("route", ["sdpa", "matmuls"])
def test_sdpa_and_the_explicit_maths_agree_with_additive_and_boolean_masks(route, monkeypatch):
    if route == "sdpa":  # no sequence is short enough for the matmuls: SDPA computes the non-explicit call
        monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, generator=g) for _ in range(3))
    keep = torch.ones(3, 7, dtype=torch.long)
    keep[1, 5:] = 0
    keep[2, 2:] = 0
    additive = extended_attention_mask(keep, q.dtype)  # [3, 1, 1, 7]
    boolean = keep.bool()[:, None, None, :]
    fast, none = attend(q, k, v, additive, 0.0, False)
    slow, probs = attend(q, k, v, additive, 0.0, False, explicit=True)
    slow_bool, _ = attend(q, k, v, boolean, 0.0, False, explicit=True)
    assert none is None and probs.shape == (3, 2, 7, 7)
    assert torch.allclose(fast, slow, atol=1e-6) and torch.allclose(slow, slow_bool, atol=1e-6)
    assert probs[2, :, :, 2:].abs().max() == 0 and torch.allclose(probs.sum(-1), torch.ones(3, 2, 7))
    assert extended_attention_mask(torch.ones(2, 5, dtype=torch.long), torch.float32) is None  # nothing to mask


def test_short_sequences_in_cpu_inference_attend_with_matmuls_and_agree_with_sdpa(monkeypatch):
    sdpa_calls = []
    real_sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **k: sdpa_calls.append(1) or real_sdpa(*a, **k))
    g = torch.Generator().manual_seed(2)
    limits = attention.MATMUL_ATTENTION_MAX_LENGTH
    q, k, v = (torch.randn(5, 3, limits["threads"], 8, generator=g) for _ in range(3))
    keep = torch.ones(5, limits["threads"], dtype=torch.bool)
    keep[1, 3:] = False
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert attention.matmuls_beat_sdpa(q) and not attention.matmuls_beat_sdpa(torch.randn(1, 1, limits["threads"] + 1, 8))
        for mask in (None, keep[:, None, None, :]):
            with torch.inference_mode():
                ctx, probs = attend(q, k, v, mask, 0.0, False)
            assert probs is None and not sdpa_calls
            assert torch.allclose(ctx, real_sdpa(q, k, v, attn_mask=mask), atol=1e-6)
        torch.set_num_threads(1)  # one thread: SDPA is as fast from a shorter length on
        assert not attention.matmuls_beat_sdpa(q) and attention.matmuls_beat_sdpa(q[:, :, : limits["one thread"]])
    finally:
        torch.set_num_threads(threads)
    # Training (gradients, or training mode without them), other dtypes and traced graphs keep SDPA.
    assert not attention.matmuls_beat_sdpa(q.clone().requires_grad_())
    assert attention.matmuls_beat_sdpa(q[:, :, :4]) and not attention.matmuls_beat_sdpa(q[:, :, :4], training=True)
    assert not attention.matmuls_beat_sdpa(q.to(torch.bfloat16))
    monkeypatch.setattr(attention, "static_graph", lambda: True)
    assert not attention.matmuls_beat_sdpa(q[:, :, :4])


def test_unpadded_rows_round_trip_and_attend_like_the_padded_batch():
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])  # right- and left-padded
    layout = Unpadded.from_mask(mask, extended_attention_mask(mask, torch.float32))
    x = torch.randn(2, 5, 6, generator=g)
    rows = layout.unpad(x)  # [T, C]
    assert rows.shape == (7, 6) and torch.equal(layout.pad(rows)[mask.bool()], x[mask.bool()])
    assert layout.pad(rows)[~mask.bool()].abs().max() == 0
    qkv = torch.randn(2, 5, 3 * 4, generator=g)
    padded, _ = Padded(layout.mask).attend(qkv, 2, 0.0, False, False)
    unpadded, _ = layout.attend(layout.unpad(qkv), 2, 0.0, False, False)
    assert torch.allclose(unpadded, padded[mask.bool()], atol=1e-6)


@pytest.mark.parametrize("route", ["sdpa", "matmuls"])
@pytest.mark.parametrize("backend,max_padding", [("aten", 0.0), ("auto", 0.0), ("auto", 0.5), ("aten", 100.0)])
def test_packed_layout_equals_padded_model(backend, max_padding, route, monkeypatch):
    if route == "sdpa":  # every call by SDPA, and every run may merge
        monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=40)
    model = bertforge.BertModel(config).eval()
    lengths = [9, 9, 7, 3, 3, 3, 1]  # non-increasing, runs of equal length, one single-token sequence
    seqs = [torch.randint(1, 50, (n,)).tolist() for n in lengths]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in lengths]
    batch = pack(seqs, types)
    assert length_groups(lengths) == [(0, 2, 9), (18, 1, 7), (25, 3, 3), (34, 1, 1)]
    with torch.inference_mode():
        with linear_backend(backend):
            packed = model.forward_packed(batch, max_padding)  # [T, H]
        ids = torch.zeros(len(seqs), 9, dtype=torch.long)
        tt = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for i, (s, t) in enumerate(zip(seqs, types)):
            ids[i, : len(s)], tt[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), torch.tensor(t), 1
        padded = model(ids, mask, tt).last_hidden_state
    assert packed.shape == (sum(lengths), 32)
    expected = torch.cat([padded[i, :n] for i, n in enumerate(lengths)])
    assert (packed - expected).abs().max() < 1e-5


@pytest.mark.parametrize("route", ["sdpa", "matmuls"])
@pytest.mark.parametrize("total", [28, 33, 64])  # one filler shorter than the last sequence; several of its length
def test_padded_to_appends_fillers_that_leave_the_real_rows_as_they_were(total, route, monkeypatch):
    if route == "sdpa":
        monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=48, max_position_embeddings=40)
    model = bertforge.BertModel(config).eval()
    lengths = [9, 7, 5, 5]
    batch = pack([torch.randint(1, 50, (n,)).tolist() for n in lengths], [[1] * n for n in lengths])
    padded = batch.padded_to(total, pad_id=3)
    assert batch.tokens == 26 and padded.tokens == total and padded.lengths[:4] == lengths
    assert padded.lengths == sorted(padded.lengths, reverse=True) and sum(padded.lengths) == total
    assert padded.input_ids[26:].eq(3).all() and padded.token_type_ids[26:].eq(0).all()
    assert padded.position_ids[26:].tolist() == [i for n in padded.lengths[4:] for i in range(n)]
    assert batch.padded_to(20) is batch and batch.padded_to(26) is batch  # nothing to add
    with torch.inference_mode():
        exact, bucketed = model.forward_packed(batch), model.forward_packed(padded)
    assert bucketed.shape == (total, 32) and (bucketed[:26] - exact).abs().max() < 1e-6


def test_bucket_size_rounds_up_by_at_most_an_eighth_to_few_sizes():
    sizes = {t: attention.bucket_size(t) for t in range(1, 8193)}
    assert [sizes[t] for t in (1, 16, 17, 100, 128, 129, 4000, 4096, 4097)] == [16, 16, 32, 112, 128, 144, 4096, 4096, 4608]
    assert all(b >= t and (b - t < 16 or b <= 1.125 * t) for t, b in sizes.items())
    assert all(sizes[b] == b for b in sizes.values())  # a bucket is its own bucket
    assert len({b for t, b in sizes.items() if t <= 4096}) == 48


def test_attention_plan_merges_runs_within_padding_budget(monkeypatch):
    lengths = [9, 9, 7, 3, 3, 3, 1]
    short = [(b.start, b.count, b.length) for b in attention_plan(lengths, 100.0)]
    assert short == [(0, 2, 9), (18, 1, 7), (25, 3, 3), (34, 1, 1)]  # runs the matmuls attend never merge
    assert len(attention_plan(lengths, 100.0, merge_short=True)) == 1  # in training SDPA attends them: they merge
    assert len(attention_plan([70, 66, 60, 9], 100.0)) == 1  # a call SDPA computes takes the shorter runs in
    monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    unmerged = attention_plan(lengths, 0.0)
    assert [(b.start, b.count, b.length, b.mask is None) for b in unmerged] == [
        (0, 2, 9, True), (18, 1, 7, True), (25, 3, 3, True), (34, 1, 1, True)]
    merged = attention_plan(lengths, 0.5)  # 9,9,7 padded to 9: 27 positions for 25 real; 3,3,3,1 to 3: 12 for 10
    assert [(b.start, b.count, b.length, b.real) for b in merged] == [(0, 3, 9, 25), (25, 4, 3, 10)]
    b = merged[0]
    assert b.mask.shape == (3, 1, 1, 9) and int(b.mask.sum()) == 25
    assert b.gather.tolist()[18:27] == [18, 19, 20, 21, 22, 23, 24, 18, 18]  # third sequence + 2 padding rows
    assert b.gather[b.scatter].tolist() == list(range(25))  # real rows come back in packed order
    assert len(attention_plan(lengths, 100.0)) == 1


def test_the_padded_model_compiles_as_one_graph_with_or_without_padding():
    """Under torch.compile the all-ones shortcut of the mask is not taken (it would break the graph on a data-
    dependent branch): fullgraph=True must hold, and the compiled model must equal eager with and without padding."""
    torch.manual_seed(0)
    model = bertforge.BertForSequenceClassification(BertConfig.preset("tiny", vocab_size=50)).eval()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    ids = torch.randint(5, 50, (2, 7))
    for mask in (torch.ones(2, 7, dtype=torch.long), torch.tensor([[1] * 7, [1] * 4 + [0] * 3])):
        with torch.no_grad():
            torch.testing.assert_close(compiled(ids, mask).logits, model(ids, mask).logits, rtol=0, atol=1e-6)
    torch._dynamo.reset()


@pytest.mark.parametrize("length", [1, 5, 15, 16, 40])
def test_softmax_last_equals_torch_softmax_short_rows_included(length):
    """Rows shorter than a vector register take three in-place passes outside autograd; the result is softmax's,
    masked keys (the dtype's minimum) included, and under autograd it is softmax itself, with its gradient."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(4, 3, length, length, generator=g) * 5
    scores[1, :, :, length // 2 + 1 :] = torch.finfo(torch.float32).min
    want = scores.softmax(-1)
    with torch.inference_mode():
        got = attention.softmax_last(scores.clone())
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    leaf = scores.clone().requires_grad_()
    out = attention.softmax_last(leaf)
    (out * torch.arange(length)).sum().backward()
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()


def test_forward_packed_merges_short_runs_in_training_only(monkeypatch):
    """Training attends every call with SDPA, whose calls have a fixed cost: short runs merge there (train-embeddings
    runs the packed layout with 0.5 padding); in inference the matmuls attend them unmerged."""
    plans = []
    real = attention.attention_plan
    monkeypatch.setattr(attention, "attention_plan", lambda *args: plans.append(real(*args)) or plans[-1])
    torch.manual_seed(0)
    model = bertforge.BertModel(BertConfig.preset("tiny", vocab_size=50))
    batch = pack([[5, 6, 7, 8], [5, 6, 7], [9, 9, 9], [7, 8]])
    with torch.no_grad():
        model.eval().forward_packed(batch, 0.5)
        model.train().forward_packed(batch, 0.5)
    assert [len(plan) for plan in plans] == [3, 1]  # runs 4 | 3, 3 | 2 apart; then one call: 12 real of 16 places


# ------------------------------------------------------------------ every path against the maths written out
# q and k of std 1 and a head size of 16: the scale (1/4) changes the scores by several units, so a wrong scale,
# a scale applied twice or not at all, moves the result far beyond float rounding (with a model's 0.02-std weights
# it would not). Each test forces its path (and checks it was taken) instead of asking the code which it takes.


def reference_attention(q, k, v, keep=None, scale=None, drop=None):
    """softmax(q kᵀ · scale, masked where `keep` is False) [· drop] v, in float64; scale 1/√hd unless given."""
    q, k, v = q.double(), k.double(), v.double()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-1, -2)) * scale
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    probs = torch.exp(scores - scores.amax(-1, keepdim=True))
    probs = probs / probs.sum(-1, keepdim=True)
    if drop is not None:
        probs = probs * drop.double()
    return (probs @ v).float()


def qkv_std1(n=3, nh=2, L=7, hd=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, nh, L, hd, generator=g) for _ in range(3))


def padding(n, L):
    """[n, L] bool keep-mask: row 1 right-padded, row 2 left-padded, each row with at least one real key."""
    keep = torch.ones(n, L, dtype=torch.bool)
    keep[1, L - L // 3 :] = False
    keep[2 % n, : L // 2] = False
    return keep


def no_sdpa(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("SDPA was called on a path that must not use it")

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", refuse)


@pytest.mark.parametrize("scale", [None, 0.7])
@pytest.mark.parametrize("masked", [False, True])
def test_sdpa_path_equals_the_reference_maths(scale, masked, monkeypatch):
    monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    calls = []
    real_sdpa = attention.F.scaled_dot_product_attention
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real_sdpa(*a, **k))
    q, k, v = qkv_std1(L=40)
    keep = padding(3, 40)[:, None, None, :] if masked else None
    additive = extended_attention_mask(padding(3, 40).long(), torch.float32) if masked else None
    with torch.inference_mode():
        ctx, probs = attend(q, k, v, additive, 0.0, False, scale=scale)
    assert calls and probs is None
    torch.testing.assert_close(ctx, reference_attention(q, k, v, keep, scale), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("length", [5, 20])  # 5: rows shorter than a vector register (the in-place softmax)
@pytest.mark.parametrize("scale", [None, 0.7])
def test_inference_matmul_path_for_short_sequences_equals_the_reference_maths(length, scale, monkeypatch):
    no_sdpa(monkeypatch)
    q, k, v = qkv_std1(L=length, seed=1)
    keep = padding(3, length)[:, None, None, :]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # MATMUL_ATTENTION_MAX_LENGTH["threads"]: 20 is short enough
        for mask in (None, keep, extended_attention_mask(keep[:, 0, 0].long(), torch.float32)):
            with torch.inference_mode():
                ctx, probs = attend(q.clone(), k, v, mask, 0.0, False, scale=scale)
            assert probs is None
            want = reference_attention(q, k, v, None if mask is None else keep, scale)
            torch.testing.assert_close(ctx, want, atol=2e-5, rtol=1e-4)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_cpu_training_path_with_attention_dropout_equals_the_reference_maths(grad, scale, monkeypatch):
    """Training with p > 0 on CPU takes the explicit matmuls. `ops.dropout` as attention uses it is replaced by a
    fixed mask (kept with 1/(1-p), dropped with 0) drawn here; the reference applies the same mask."""
    no_sdpa(monkeypatch)
    p = 0.25
    q, k, v = qkv_std1(L=9, seed=2)
    g = torch.Generator().manual_seed(5)
    drop = (torch.rand(3, 2, 9, 9, generator=g) >= p).float() / (1 - p)
    seen = []

    def fixed_dropout(x, rate, training):
        assert rate == p and training and x.shape == drop.shape
        seen.append(1)
        return x * drop

    monkeypatch.setattr(attention, "dropout", fixed_dropout)
    keep = padding(3, 9)[:, None, None, :]
    additive = extended_attention_mask(keep[:, 0, 0].long(), torch.float32)
    leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
    ctx, probs = attend(*leaves, additive, p, True, scale=scale)
    assert seen and probs is not None
    want = reference_attention(q, k, v, keep, scale, drop)
    torch.testing.assert_close(ctx.detach(), want, atol=2e-5, rtol=1e-4)
    eye = torch.eye(9).expand(3, 2, 9, 9)  # v = I: the reference returns its probabilities (before dropout)
    torch.testing.assert_close(probs.detach(), reference_attention(q, k, eye, keep, scale), atol=2e-6, rtol=1e-4)
    if grad:  # and the gradient is that of the reference maths
        ctx.sum().backward()
        ref = [t.double().clone().requires_grad_() for t in (q, k, v)]
        s = (ref[0] @ ref[1].transpose(-1, -2)) * (16 ** -0.5 if scale is None else scale)
        s = s.masked_fill(~keep, float("-inf"))
        (s.softmax(-1) * drop.double() @ ref[2]).sum().backward()
        for got, want_t in zip(leaves, ref):
            torch.testing.assert_close(got.grad, want_t.grad.float(), atol=1e-4, rtol=1e-4)


def test_a_model_trained_with_attention_dropout_computes_what_eval_computes_when_dropout_keeps_everything(monkeypatch):
    """End to end: a BertModel in training mode with attention dropout (the CPU explicit path), dropout made the
    identity in attention only, equals the same model in eval mode attended by SDPA, weights of std 1 (at 0.02 the
    attention scale barely moves the scores)."""
    monkeypatch.setattr(attention, "MATMUL_ATTENTION_MAX_LENGTH", SDPA_ONLY)
    monkeypatch.setattr(attention, "dropout", lambda x, p, training: x)
    config = BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.3)
    torch.manual_seed(0)
    model = bertforge.BertModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.0 if "attention.self" in name else 0.2)
    ids = torch.randint(1, 50, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    want = model.eval()(ids, mask).last_hidden_state
    got = model.train()(ids, mask).last_hidden_state
    real = mask.bool()
    assert (got[real] - want[real]).abs().max() < 1e-4
    with torch.no_grad():  # and the scale matters here: half of it changes the output by far more than that
        half = attention.attend(*qkv_std1(L=12), None, 0.0, False, scale=0.125)[0]
        assert (half - attention.attend(*qkv_std1(L=12), None, 0.0, False)[0]).abs().max() > 0.1


@pytest.mark.parametrize("L", [128, 141])
@pytest.mark.parametrize("scale", [None, 0.7])
@pytest.mark.parametrize("training", [False, True])
def test_blockwise_sliding_window_equals_the_reference_maths(scale, training, L, monkeypatch):
    """A window of 4 (|i - j| <= 2) over 128 positions, and over 141 (not a multiple of the 16-query block: the last
    block is partial, 13 queries, its tail padded): `attend_scored` attends it in blocks (`attend_blocks`), which
    must equal dense masked attention written out, padding included."""
    from bertforge.model.attention import Scores, attend_scored

    calls = []
    real_blocks = attention.attend_blocks
    monkeypatch.setattr(attention, "attend_blocks", lambda *a, **k: calls.append(1) or real_blocks(*a, **k))
    if training:  # the training path with dropout, dropout made the identity
        monkeypatch.setattr(attention, "dropout", lambda x, p, training: x)
    window = 4
    q, k, v = qkv_std1(n=2, L=L, seed=3)
    keep = torch.ones(2, L, dtype=torch.bool)
    keep[1, 100:] = False  # right padding
    pos = torch.arange(L)
    band = (pos[:, None] - pos[None, :]).abs() <= window // 2  # [L, L]
    for mask in (None, extended_attention_mask(keep.long(), torch.float32)):
        ctx, _ = attend_scored(q, k, v, mask, 0.1 if training else 0.0, training, False, Scores(window=window, scale=scale))
        full = band if mask is None else band & keep[:, None, None, :]
        want = reference_attention(q, k, v, full, scale)
        rows = slice(None) if mask is None else keep  # padded query rows are not compared
        got_rows = ctx if mask is None else ctx.transpose(1, 2)[rows]
        want_rows = want if mask is None else want.transpose(1, 2)[rows]
        torch.testing.assert_close(got_rows, want_rows, atol=2e-5, rtol=1e-4)
    assert len(calls) == 2
