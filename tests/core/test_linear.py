"""The oneDNN path of `bertforge.core.linear` computes what `F.linear` computes: outputs and all three gradients, for
the layer alone and for a whole pretraining step. (oneDNN sums in another order, so the match is to float
rounding, not bitwise.) Its int8 kernels (`Int8Weight`, oneDNN's and FBGEMM's) against F.linear, and what they
refuse."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import bertforge
from bertforge.core.errors import BertforgeError
from bertforge.core.linear import (
    INT8_KERNELS,
    Int8Weight,
    get_linear_backend,
    int8_available,
    int8_kernel_works,
    linear,
    linear_backend,
    onednn_available,
    set_linear_backend,
)

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch has no oneDNN linear kernels")


def cpu_flags() -> set[str]:
    """The CPU's flags as the kernel reports them (empty where there is no /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return next((set(line.split(":", 1)[1].split()) for line in fh if line.startswith("flags")), set())
    except OSError:
        return set()


def expected_int8_kernels() -> list[str]:
    """The int8 kernels this CPU and this PyTorch build should run, from the CPU's flags and PyTorch's list of
    quantized engines, never from `bertforge.core.linear`'s own probe (a broken kernel would then drop out of the tests
    instead of failing them): oneDNN's with VNNI (AVX-512 VNNI or AVX-VNNI), FBGEMM's with AVX2."""
    flags, engines = cpu_flags(), set(torch.backends.quantized.supported_engines)
    kernels = []
    if {"avx512_vnni", "avx_vnni"} & flags and "onednn" in engines and torch.backends.mkldnn.is_available():
        kernels.append("onednn")
    if "avx2" in flags and "fbgemm" in engines:
        kernels.append("fbgemm")
    return kernels


KERNELS = expected_int8_kernels()
needs_int8 = pytest.mark.skipif(not KERNELS, reason="this CPU or PyTorch has no int8 kernel bertforge runs")


def grads_of(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    out = fn(*leaves)
    g = torch.Generator().manual_seed(7)
    out.backward(torch.randn(out.shape, generator=g))
    return out.detach(), [t.grad if t.requires_grad else None for t in leaves]


@needs_onednn
@pytest.mark.parametrize("shape", [(37, 24), (3, 11, 24), (2, 3, 5, 24)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("strided", [False, True])
def test_onednn_linear_equals_f_linear(shape, bias, strided):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape[:-1], 2 * shape[-1], generator=g)[..., ::2] if strided else torch.randn(*shape, generator=g)
    w = torch.randn(40, shape[-1], generator=g)
    b = torch.randn(40, generator=g) if bias else None
    x.requires_grad_(), w.requires_grad_()
    if b is not None:
        b.requires_grad_()
    tensors = (x, w) + ((b,) if b is not None else ())
    ref, ref_grads = grads_of(lambda *t: F.linear(*t), *tensors)
    with linear_backend("onednn"):
        out, grads = grads_of(lambda *t: linear(*t), *tensors)
    assert out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_onednn_linear_respects_needs_grad():
    x, w, b = torch.randn(6, 8), torch.randn(5, 8, requires_grad=True), torch.randn(5)
    with linear_backend("onednn"):
        linear(x, w, b).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(6, 5).t() @ x)
    assert x.grad is None and b.grad is None


def test_other_tensors_take_f_linear():
    """float64, bfloat16 autocast and empty inputs are not oneDNN's: the result is F.linear's, bit for bit."""
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(4, 8, generator=g, dtype=torch.float64), torch.randn(3, 8, generator=g, dtype=torch.float64), None
    assert torch.equal(linear(x, w, b), F.linear(x, w, b))
    x32, w32 = x.float(), w.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = linear(x32, w32)
        assert out.dtype == torch.bfloat16 and torch.equal(out, F.linear(x32, w32))
    assert linear(torch.empty(0, 8), w32).shape == (0, 3)


def test_backend_switch():
    before = get_linear_backend()
    with linear_backend("aten"):
        assert get_linear_backend() == "aten"
    assert get_linear_backend() == before
    with pytest.raises(ValueError, match="one of"):
        set_linear_backend("blas")


@needs_onednn
def test_pretraining_step_same_loss_and_gradients_with_either_backend():
    """A BertForPreTraining step (padded batch, unpadded encoder, sparse MLM, NSP): oneDNN against F.linear."""
    cfg = bertforge.BertConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=128, max_position_embeddings=32, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    model = bertforge.BertForPreTraining(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 200, (4, 20), generator=g)
    mask = torch.ones(4, 20, dtype=torch.long)
    mask[1, 12:] = 0
    mask[3, 5:] = 0
    labels = torch.where((torch.rand(4, 20, generator=g) < 0.3) & (mask == 1), ids, torch.full_like(ids, -100))
    labels[:, 1] = ids[:, 1]
    nsp = torch.tensor([0, 1, 1, 0])
    results = {}
    for backend in ("aten", "onednn"):
        model.zero_grad(set_to_none=True)
        with linear_backend(backend):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels, next_sentence_label=nsp).loss
            loss.backward()
        results[backend] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (loss_a, grads_a), (loss_o, grads_o) = results["aten"], results["onednn"]
    assert abs(loss_a - loss_o) <= 1e-5 * abs(loss_a)
    assert grads_a.keys() == grads_o.keys() and len(grads_a) > 20
    for name, grad in grads_a.items():
        assert (grads_o[name] - grad).abs().max() <= 1e-5 * max(1.0, grad.abs().max().item()), name


# ---------------------------------------------------------------------------------------------- the int8 kernel
@needs_int8
def test_every_int8_kernel_the_cpu_supports_passes_the_probe_and_the_preferred_one_is_in_use():
    """The probe (`int8_kernel_works`) must accept each kernel the CPU supports (a probe failing on a broken kernel
    would otherwise fall back silently), and oneDNN's, where the CPU has VNNI, is the one layers use."""
    import bertforge.core.linear as module

    assert set(KERNELS) <= set(INT8_KERNELS)
    for kernel in KERNELS:
        assert int8_kernel_works(kernel), f"the CPU supports the {kernel} int8 kernel but the probe rejects it"
    preferred = KERNELS[0]  # onednn where the CPU has VNNI, else fbgemm
    module.set_int8_kernel("onednn")  # the default choice
    assert module.int8_kernel() == preferred and Int8Weight(torch.randn(8, 16)).kernel == preferred
    assert int8_available()


def skewed_rows(g: torch.Generator) -> torch.Tensor:
    """[6, 48] rows whose largest magnitude is not their maximum: asymmetric, negative-dominated, all negative, all
    positive, a negative outlier, an ordinary one."""
    x = torch.randn(6, 48, generator=g)
    x[0] = x[0].abs() * -3 + 0.5  # mostly negative, a small positive maximum
    x[1] = -x[1].abs() - 0.1  # all negative: the maximum is below zero
    x[2] = x[2].abs() * 2 + 1  # all positive, far from zero
    x[3, 5] = -40.0  # one large negative value
    x[4] = x[4] * 0.5 - 2.0  # shifted down
    return x


@needs_int8
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("act,with_bias,with_residual", [(None, True, False), ("gelu", True, False), (None, False, True)])
def test_int8_linear_on_asymmetric_and_negative_dominated_rows(kernel, act, with_bias, with_residual):
    """Each row is scaled by its largest magnitude: with a maximum-only scale, the rows here would be clipped (the
    all-negative one entirely)."""
    g = torch.Generator().manual_seed(4)
    x = skewed_rows(g)
    w, b, r = torch.randn(40, 48, generator=g), torch.randn(40, generator=g), torch.randn(6, 40, generator=g)
    bias, residual = (b if with_bias else None), (r if with_residual else None)
    want = F.linear(x.double(), w.double(), None if bias is None else bias.double())
    want = want if act is None else F.gelu(want)
    want = (want if residual is None else want + residual.double()).float()
    with torch.inference_mode():
        got = linear(x.clone(), Int8Weight(w, bias, kernel=kernel), act=act, residual=residual)
    per_row = (got - want).abs().amax(-1) / (want - (0 if residual is None else residual)).abs().amax(-1)
    assert per_row.max() < 0.03, per_row


@needs_int8
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("act", [None, "gelu", "relu"])
@pytest.mark.parametrize("with_bias,with_residual", [(True, False), (False, False), (True, True)])
def test_int8_linear_is_close_to_float32(act, with_bias, with_residual, kernel):
    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(*s, generator=g) for s in ((3, 7, 48), (40, 48), (40,), (3, 7, 40)))
    x[1, 2] *= 30  # an outlier token: the other rows keep their own scale
    bias = b if with_bias else None
    residual = r if with_residual and act is None else None
    want = F.linear(x, w, bias)
    want = want if act is None else {"gelu": F.gelu, "relu": F.relu}[act](want)
    want = want if residual is None else want + residual
    with torch.inference_mode():
        weight = Int8Weight(w, bias, kernel=kernel)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a call warns nothing (PyTorch's quantized-tensor notice included)
            got = linear(x, weight, act=act, residual=residual)
    assert got.shape == want.shape
    per_row = (got - want).abs().amax(-1) / want.abs().amax(-1)  # [3, 7]
    assert per_row.max() < 0.03, per_row.max()


@needs_int8
def test_int8_kernel_follows_the_environment_and_names_a_bad_choice(monkeypatch):
    """BERTFORGE_INT8_KERNEL, read by the runtime set-up (`system.apply_switches`), reaches `set_int8_kernel`."""
    import bertforge.core.linear as module
    from bertforge.core.system import apply_switches, read_switches

    try:
        monkeypatch.setenv("BERTFORGE_INT8_KERNEL", "fbgemm")
        apply_switches(read_switches())
        assert module.int8_kernel() == "fbgemm" and Int8Weight(torch.randn(8, 16)).kernel == "fbgemm"
        monkeypatch.setenv("BERTFORGE_INT8_KERNEL", "bogus")
        with pytest.raises(BertforgeError, match="BERTFORGE_INT8_KERNEL must be one of onednn, fbgemm"):
            apply_switches(read_switches())
        with pytest.raises(ValueError, match="int8 kernel must be one of"):
            module.set_int8_kernel("bogus")
    finally:
        monkeypatch.delenv("BERTFORGE_INT8_KERNEL")
        module.set_int8_kernel("onednn")
    assert module.int8_kernel() == ("onednn" if "onednn" in KERNELS else "fbgemm")


@needs_int8
def test_int8_weight_refuses_what_it_cannot_run():
    w = torch.randn(8, 16)
    weight = Int8Weight(w)
    with pytest.raises(BertforgeError, match="inference only"):
        weight(torch.randn(2, 16, requires_grad=True))
    with pytest.raises(BertforgeError, match="float32 CPU inputs"):
        weight(torch.randn(2, 16, dtype=torch.bfloat16))
    with pytest.raises(BertforgeError, match="float32 CPU matrix"):
        Int8Weight(w.double())
    with pytest.raises(ValueError, match="holds its bias"):
        linear(torch.randn(2, 16), weight, torch.zeros(8))
