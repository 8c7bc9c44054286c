"""y = x Wᵀ + b for the model's dense layers, with the matrix multiplies done by the fastest kernel PyTorch has.

On CPU, `F.linear` runs MKL's sgemm. On AMD CPUs MKL takes its AVX2 path, and with two threads it reaches
120-195 GFLOP/s on BERT's shapes here, where oneDNN's kernels (also inside PyTorch,
`torch.ops.mkldnn._linear_pointwise`) reach 175-215 on the same shapes (AMD EPYC, 2 cores, 2026-11-23;
`bench/train_speed.py` measures both). `linear` sends float32 CPU tensors through oneDNN for the forward and
input-gradient matrix multiplies of a dense layer (the weight gradient stays with MKL, see `_OneDnnLinear`) and
everything else through `F.linear`. The maths is the same: results differ from `F.linear`'s by summation order
only (~1e-6 relative).

Without autograd (inference), `linear` also fuses what follows the matrix multiply into oneDNN's kernel: the
activation (`act`: GELU, ReLU) or a residual add (`residual`), which saves a pass over the output.

`set_linear_backend("aten")` (or BERTFORGE_LINEAR=aten in the environment) makes every layer use `F.linear`, the
reference path; `with linear_backend("aten"):` does it for one block of code in the current thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import BertforgeError
from .ops import activation_fn

BACKENDS = ("auto", "aten", "onednn")
_backend = os.environ.get("BERTFORGE_LINEAR", "auto")  # the process's default
_local = threading.local()  # `linear_backend(...)` blocks: a per-thread override

# hidden_act -> oneDNN post-op (name, algorithm) that computes it inside the matrix multiply.
_FUSED_ACTIVATIONS = {
    "gelu": ("gelu", "none"),  # exact (erf) GELU
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "gelu_fast": ("gelu", "tanh"),
    "relu": ("relu", ""),
}


@functools.cache
def onednn_available() -> bool:
    """Whether PyTorch has oneDNN's fused linear kernels and they compute what `F.linear` computes."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        op = torch.ops.mkldnn._linear_pointwise
        g = torch.Generator().manual_seed(0)
        x, w, b, r = (torch.randn(*shape, generator=g) for shape in ((5, 16), (8, 16), (8,), (5, 8)))
        with torch.inference_mode():
            fused = op.binary(x, r, w, b, "add")
            gelu = op(x, w, b, "gelu", [], "none")
            plain = op(x, w, None, "none", [], "")
            return bool(torch.allclose(fused, F.linear(x, w, b) + r, atol=1e-5)
                        and torch.allclose(gelu, F.gelu(F.linear(x, w, b)), atol=1e-5)
                        and torch.allclose(plain, x @ w.t(), atol=1e-5))
    except (AttributeError, RuntimeError):
        return False


def set_linear_backend(backend: str) -> None:
    """"auto" (oneDNN for float32 CPU tensors where PyTorch has it), "aten" (`F.linear` always) or "onednn"
    (like auto, but an error where oneDNN is not available)."""
    global _backend
    if backend not in BACKENDS:
        raise ValueError(f"linear backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "onednn" and not onednn_available():
        raise ValueError("the oneDNN linear backend needs a PyTorch built with oneDNN (mkldnn)")
    _backend = backend


def get_linear_backend() -> str:
    return getattr(_local, "backend", None) or _backend


@contextlib.contextmanager
def linear_backend(backend: str) -> Iterator[None]:
    """`with linear_backend("aten"): ...` runs the block with that backend in this thread, then restores the
    previous one (other threads keep theirs)."""
    if backend not in BACKENDS:
        raise ValueError(f"linear backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "onednn" and not onednn_available():
        raise ValueError("the oneDNN linear backend needs a PyTorch built with oneDNN (mkldnn)")
    before = getattr(_local, "backend", None)
    _local.backend = backend
    try:
        yield
    finally:
        _local.backend = before


class _OneDnnLinear(torch.autograd.Function):
    """x Wᵀ + b with the forward and the input-gradient multiplies by oneDNN.

    The weight gradient gᵀ x stays with MKL (`torch.mm` on transposed views): oneDNN would need contiguous
    transposes of both activations, and those copies cost more than its faster kernel saves (measured here).
    """

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, "none", [], "")  # [M, N]
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        x2, weight = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1]).contiguous()  # [M, N]
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:  # [M, N] @ [N, K]: oneDNN reads Wᵀ as a view (its weight reorder transposes)
            gx = torch.ops.mkldnn._linear_pointwise(g2, weight.t(), None, "none", [], "")
            gx = gx.view(*grad.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:
            gw = g2.t().mm(x2)  # [N, M] @ [M, K]
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def check_linear_backend() -> None:
    """Raise BertforgeError when BERTFORGE_LINEAR names no backend, or oneDNN where PyTorch lacks it (training
    commands call this before they write anything; `set_linear_backend` checks its own argument)."""
    if _backend not in BACKENDS:
        raise BertforgeError(f"BERTFORGE_LINEAR must be one of {', '.join(BACKENDS)}, got {_backend!r}")
    if _backend == "onednn" and not onednn_available():
        raise BertforgeError("BERTFORGE_LINEAR=onednn, but this PyTorch has no oneDNN linear kernels (mkldnn)")


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    if get_linear_backend() == "aten":
        return False
    check_linear_backend()
    return (
        type(x) is Tensor  # not a DTensor or other subclass
        and type(weight) in (Tensor, torch.nn.Parameter)
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and x.dim() >= 2
        and x.numel() > 0
        and not torch.is_autocast_enabled("cpu")
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()  # ONNX export records F.linear, a standard op
        and onednn_available()
    )


def _records_grad(*tensors: Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, *, act: str | None = None, residual: Tensor | None = None
) -> Tensor:
    """act(x [..., K] Wᵀ [K, N] + b [N]) + residual [..., N] → [..., N] (`act` a `hidden_act` name or None).

    See the module docstring for which kernel runs; without autograd, oneDNN applies `act` or `residual` inside
    the matrix multiply."""
    if _use_onednn(x, weight):
        if not _records_grad(x, weight, bias, residual) and (act is None or act in _FUSED_ACTIVATIONS):
            x2 = x.reshape(-1, x.shape[-1])  # [M, K]
            shape = (*x.shape[:-1], weight.shape[0])
            if residual is not None and act is None:  # x Wᵀ + b + residual
                r2 = residual.reshape(-1, weight.shape[0])
                return torch.ops.mkldnn._linear_pointwise.binary(x2, r2, weight, bias, "add").view(shape)
            if residual is None:
                name, algorithm = _FUSED_ACTIVATIONS[act] if act is not None else ("none", "")
                return torch.ops.mkldnn._linear_pointwise(x2, weight, bias, name, [], algorithm).view(shape)
        y = _OneDnnLinear.apply(x, weight, bias)
    else:
        y = F.linear(x, weight, bias)
    if act is not None:
        y = activation_fn(act)(y)
    return y if residual is None else y + residual
