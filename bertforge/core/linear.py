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

`set_linear_backend("aten")` makes every layer use `F.linear`, the reference path (`system.setup_runtime` calls it
for BERTFORGE_LINEAR=aten; this module reads no environment variable); `with linear_backend("aten"):` does it for one
block of code in the current thread.

int8 (CPU inference): a layer whose weight is an `Int8Weight` (made by `bertforge.model.quantize`) runs an int8 kernel
(`int8_kernel`: oneDNN's `qlinear_pointwise` on CPUs with VNNI, else FBGEMM's `quantized.linear_dynamic`): the
weight is stored as int8 with one scale per output row and prepacked once; each call scales every row (token) of
its input into [-1, 1], quantises it to 8 bits, multiplies in integers and returns float32. The row scales, the
bias, the activation and the residual add are applied in float32 after the multiply (see `Int8Weight.__call__`).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import BertforgeError
from .ops import activation_fn

BACKENDS = ("auto", "aten", "onednn")
_backend = "auto"  # the process's backend (`set_linear_backend`)
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
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [M, K]
        y = torch.ops.mkldnn._linear_pointwise(x2, weight, bias, "none", [], "")  # [M, N]
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):
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


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    if get_linear_backend() == "aten":
        return False
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


# PyTorch 2.10+ warns (once per process) that creating quantized tensors is deprecated; FBGEMM's kernel still takes
# its weight that way, and `torch.quantize_per_tensor` is the one-pass float → uint8 quantiser the oneDNN path uses
# (as of 2.13 there is no other for either). Only this warning, and only while a weight is packed, is silenced.
_QTENSOR_DEPRECATION = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation"


@functools.cache
def cpu_has_vnni() -> bool:
    """Whether the CPU multiplies uint8 by int8 with 32-bit sums (AVX-512 VNNI or AVX-VNNI). Without it, FBGEMM's
    AVX2 kernels add pairs of products in 16 bits, which can saturate unless inputs keep to 7 bits."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = next((line.split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


#: int8 matrix-multiply kernels `Int8Weight` can run: oneDNN's (`torch.ops.onednn.qlinear_pointwise`, what
#: PyTorch's compiler uses for x86 int8) or FBGEMM's dynamic one (`torch.ops.quantized.linear_dynamic`).
INT8_KERNELS = ("onednn", "fbgemm")
_int8_choice = "onednn"  # the first kernel `int8_kernel` tries (`set_int8_kernel`)


def set_int8_kernel(kernel: str) -> None:
    """"onednn" (the default: oneDNN's where it serves, else FBGEMM's) or "fbgemm" (FBGEMM's always)."""
    global _int8_choice
    if kernel not in INT8_KERNELS:
        raise ValueError(f"int8 kernel must be one of {INT8_KERNELS}, got {kernel!r}")
    _int8_choice = kernel
    int8_kernel.cache_clear()


@functools.cache
def int8_kernel() -> str | None:
    """The int8 kernel `Int8Weight` uses here: oneDNN's where PyTorch has it and the CPU has VNNI (its kernels
    then sum u8·s8 products in 32 bits; without VNNI, FBGEMM's 7-bit inputs avoid saturating), else FBGEMM's;
    None when neither computes roughly what `F.linear` does. `set_int8_kernel("fbgemm")` (BERTFORGE_INT8_KERNEL=fbgemm
    through `system.setup_runtime`) forces FBGEMM's.
    With the same per-token scales, oneDNN's made all-MiniLM-L6-v2's four int8 layers 16 % faster on 3,400 tokens
    (25.2 against 29.9 ms, 2 threads, AMD EPYC with AVX-512 VNNI, 2026-11-27)."""
    return next((k for k in INT8_KERNELS[INT8_KERNELS.index(_int8_choice) :] if int8_kernel_works(k)), None)


def int8_kernel_works(kernel: str) -> bool:
    """Whether `kernel` (of INT8_KERNELS) can serve here: oneDNN's needs VNNI (see `int8_kernel`), and either must
    run in this PyTorch and compute roughly what `F.linear` does."""
    if kernel == "onednn" and not (cpu_has_vnni() and torch.backends.mkldnn.is_available()):
        return False
    try:
        g = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*shape, generator=g) for shape in ((5, 16), (8, 16), (8,)))
        with torch.inference_mode():
            y, want = Int8Weight(w, b, kernel=kernel)(x), F.linear(x, w, b)
        return bool((y - want).abs().max() < 0.05 * want.abs().max())
    except (AttributeError, RuntimeError, BertforgeError):
        return False


def _as_uint8(q: Tensor) -> Tensor:
    """A quint8 tensor's bytes as a plain uint8 tensor, without a copy (`int_repr()` copies)."""
    return torch.empty(0, dtype=torch.uint8).set_(q.untyped_storage(), q.storage_offset(), q.shape, q.stride())


class Int8Weight:
    """A dense layer's weight W [N, K] and bias [N], prepacked for an int8 kernel (`int8_kernel`: oneDNN's or
    FBGEMM's).

    W is stored as int8 with one float scale per output row (symmetric: W ≈ scale[n] · q[n, k], q in -127..127).
    Not a tensor and not a parameter: a module holding it has nothing to train, save or move.

    `smooth` [K] (SmoothQuant, Xiao et al. 2022): the input's channel k is divided by smooth[k] and W's column k
    multiplied by it, which leaves x Wᵀ unchanged but moves the spread of a few large input channels into the
    weight, where one scale per row quantises it better (`bertforge.model.quantize` chooses the factors)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, smooth: Tensor | None = None,
                 kernel: str | None = None) -> None:
        if weight.dim() != 2 or weight.device.type != "cpu" or weight.dtype != torch.float32:
            raise BertforgeError(f"int8: expected a float32 CPU matrix, got {tuple(weight.shape)} {weight.dtype} "
                                 f"on {weight.device}")
        self.kernel = kernel or int8_kernel() or "fbgemm"
        weight = weight.detach()
        self.inverse_smooth = None if smooth is None else (1 / smooth.detach().float()).contiguous()  # [K]
        weight = weight if smooth is None else weight * smooth.detach().float()
        scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # PyTorch warns once per process, the first time a quantized tensor is made
            warnings.filterwarnings("ignore", message=_QTENSOR_DEPRECATION, category=UserWarning)
            if self.kernel == "onednn":
                q = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
                self.packed = torch.ops.onednn.qlinear_prepack(q, None)
                self.weight_scale, self.weight_zero = scale, zero
                torch.quantize_per_tensor(weight[:1], 1.0, 0, torch.quint8)  # the input's quantiser, warned here
            else:
                q = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
                self.packed = torch.ops.quantized.linear_prepack(q, None)  # the bias is added after the row scales
        self.bias = None if bias is None else bias.detach().float().contiguous()  # [N]
        self.out_features, self.in_features = weight.shape
        self.reduce_range = not cpu_has_vnni()  # 7-bit inputs where 8-bit ones could saturate (see `cpu_has_vnni`)

    def __call__(self, x: Tensor, act: str | None = None, residual: Tensor | None = None) -> Tensor:
        """act(x Wᵀ + b) + residual, for float32 CPU inputs [..., K] without autograd.

        Each row (token) of x is quantised with its own scale: the rows are divided by their largest magnitude
        first, so that the kernel's one scale for the whole input fits every row, and the products are multiplied
        back. One scale for all rows loses too much: a few tokens ([CLS], [SEP], punctuation) carry activations
        ten times larger than the rest, and every other row would keep only a few bits (all-MiniLM-L6-v2: cosine
        to float32 down to 0.96 with one scale per batch, 0.996 with one per token)."""
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise BertforgeError(f"int8 layers run on float32 CPU inputs only, got {x.dtype} on {x.device}")
        if torch.is_grad_enabled() and x.requires_grad:
            raise BertforgeError("int8 layers are for inference only: they have no gradient")
        x2 = x.reshape(-1, self.in_features)  # [M, K]
        if self.inverse_smooth is not None:
            x2 = x2 * self.inverse_smooth
        # Each row's largest magnitude from its max and min: two reads, where abs() would write a copy first.
        scale = torch.maximum(x2.amax(dim=1, keepdim=True), x2.amin(dim=1, keepdim=True).neg_()).clamp_(min=1e-30)
        inverse = scale.reciprocal()  # [M, 1]; multiplying is cheaper than dividing
        x2 = x2.mul_(inverse) if self.inverse_smooth is not None else x2 * inverse  # a new tensor is ours to change
        if self.kernel == "onednn":  # rows in [-1, 1] → u8 = round(127 x) + 128 in one pass; products summed in int32
            q = _as_uint8(torch.quantize_per_tensor(x2, 1 / 127, 128, torch.quint8))
            y = torch.ops.onednn.qlinear_pointwise(q, 1 / 127, 128, self.packed, self.weight_scale, self.weight_zero,
                                                   None, 1.0, 0, torch.float32, "none", [], "")  # [M, N], no bias
        else:
            y = torch.ops.quantized.linear_dynamic(x2, self.packed, self.reduce_range)  # [M, N], no bias
        # y is the kernel's new tensor: the row scales, bias, activation and residual overwrite it
        if residual is not None and act is None:
            y = torch.addcmul(residual.reshape(-1, self.out_features), y, scale, out=y)
            y = y if self.bias is None else y.add_(self.bias)
        else:
            y = y.mul_(scale) if self.bias is None else torch.addcmul(self.bias, y, scale, out=y)
            y = y if act is None else activation_fn(act, in_place=True)(y)
            y = y if residual is None else y.add_(residual.reshape(-1, self.out_features))
        return y.view(*x.shape[:-1], self.out_features)

    def __repr__(self) -> str:
        return f"Int8Weight(out_features={self.out_features}, in_features={self.in_features})"


def int8_available() -> bool:
    """Whether this PyTorch has an int8 linear kernel (`int8_kernel`) that computes roughly what `F.linear` does."""
    return int8_kernel() is not None


def linear(
    x: Tensor, weight: Tensor | Int8Weight, bias: Tensor | None = None, *, act: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """act(x [..., K] Wᵀ [K, N] + b [N]) + residual [..., N] → [..., N] (`act` a `hidden_act` name or None).

    See the module docstring for which kernel runs; without autograd, oneDNN applies `act` or `residual` inside
    the matrix multiply. An `Int8Weight` carries its own bias (`bias` must then be None)."""
    if isinstance(weight, Int8Weight):
        if bias is not None:
            raise ValueError("an Int8Weight holds its bias; pass bias=None")
        return weight(x, act, residual)
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
