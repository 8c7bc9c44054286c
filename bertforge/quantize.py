"""int8 inference on CPU: `quantize_model(model, "int8")` prepares a loaded model for it, in place.

The dense layers of the encoder's blocks named in `parts` get their weight in int8, one scale per output row,
prepacked once (`bertforge.linear.Int8Weight`); each call quantises its input dynamically, one scale per token.
By default these are the attention output, the intermediate and the output layers (3/4 of the blocks' dense
multiply-adds); the query/key/value projection (`"attention.self"`) stays float32: its rounding errors pass through
softmax(QKᵀ) and moved all-MiniLM-L6-v2's embeddings most (smallest cosine to float32 over 1000 SST-2 sentences:
0.982 with it in int8, 0.991 without; 0.989 with only it in int8). Everything else stays float32 too: the
embeddings, every LayerNorm, the attention itself, ALBERT's embedding projection, the pooler and every task head
(the MLM decoder, classifiers, QA outputs): a small share of the work (the heads see one row per sequence, or only
masked tokens).

The pipelines (`quantize="int8"`), `bertforge embed/predict/evaluate/serve --quantize int8` all call this one
function; the packed, length-sorted engine runs unchanged on top of it. A quantised model is for CPU inference
only: its int8 layers refuse training, gradients and other devices with a `BertforgeError`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import BertforgeError
from .linear import Int8Weight, int8_available, linear
from .model import BertLayer, BertPreTrainedModel, BertSelfAttention, Dense

#: `quantize=` values: None (float32, nothing changed) or "int8".
QUANTIZE_CHOICES = ("int8",)
#: The parts of each encoder block that `quantize_model` makes int8 by default (see the module docstring).
DEFAULT_PARTS = ("attention.output", "intermediate", "output")
PARTS = ("attention.self", *DEFAULT_PARTS)


class _Int8Module(nn.Module):
    """Refuses training mode: an int8 layer has no parameters to train."""

    def check(self) -> None:
        if self.training:
            raise BertforgeError("this model was quantised to int8 for inference: call .eval(); int8 layers "
                                 "cannot be trained (fine-tune the float32 checkpoint instead)")


class Int8Dense(_Int8Module):
    """A `Dense` (y = act(x Wᵀ + b) (+ residual)) with its weight and bias prepacked in int8."""

    def __init__(self, dense: Dense) -> None:
        super().__init__()
        self.weight = Int8Weight(dense.weight, dense.bias)
        self.act = dense.act

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        self.check()
        return linear(x, self.weight, act=self.act, residual=residual)


class Int8SelfAttention(_Int8Module):
    """`BertSelfAttention`'s query, key and value projections as one prepacked int8 matrix [3H, H]."""

    def __init__(self, attention: BertSelfAttention) -> None:
        super().__init__()
        parts = (attention.query, attention.key, attention.value)
        self.weight = Int8Weight(torch.cat([p.weight for p in parts]), torch.cat([p.bias for p in parts]))

    def forward(self, x: Tensor) -> Tensor:
        """[..., H] → [..., 3H]: query, key, value side by side."""
        self.check()
        return linear(x, self.weight)


def check_quantize(quantize: str | None, device: torch.device | str | None = "cpu", what: str = "quantize") -> None:
    """Raise BertforgeError for an unknown `quantize` value, or int8 asked for off the CPU or where PyTorch lacks
    the kernels. Commands call this before they load or write anything."""
    if quantize is None:
        return
    if quantize not in QUANTIZE_CHOICES:
        raise BertforgeError(f"{what}: quantize must be one of {', '.join(QUANTIZE_CHOICES)} (or none), got {quantize!r}")
    if device is not None and torch.device(device).type != "cpu":
        raise BertforgeError(f"{what}: int8 quantisation is for CPU inference; it cannot run on {device} "
                             "(on a GPU, run the float32 or bfloat16 model)")
    if not int8_available():
        raise BertforgeError(f"{what}: this PyTorch has no dynamic int8 linear kernels (torch.ops.quantized, FBGEMM "
                             "or QNNPACK); run without --quantize")


def quantize_model(
    model: BertPreTrainedModel, quantize: str | None = "int8", parts: tuple[str, ...] = DEFAULT_PARTS
) -> BertPreTrainedModel:
    """Swap the dense layers `parts` (of `PARTS`) of `model`'s encoder blocks for int8 ones (see the module
    docstring), in place, and return it in eval mode. `quantize=None` returns the model unchanged; a model already quantised is left as is.

    Refused (BertforgeError): weights that are not float32 on the CPU. A quantised model refuses training mode
    at its first forward pass."""
    if quantize is None:
        return model
    weight = model.base_model.embeddings.word_embeddings.weight
    check_quantize(quantize, weight.device)
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise BertforgeError(f"int8: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    if weight.dtype != torch.float32:
        raise BertforgeError(f"int8 quantisation starts from float32 weights, got {weight.dtype}")
    for layer in model.base_model.encoder.layer:
        _quantize_layer(layer, parts)
    model.quantization = quantize
    return model.eval()


def _quantize_layer(layer: BertLayer, parts: tuple[str, ...]) -> None:
    if "attention.self" in parts and isinstance(layer.attention.self, BertSelfAttention):
        layer.attention.self = Int8SelfAttention(layer.attention.self)
    for name, parent in (("attention.output", layer.attention.output), ("intermediate", layer.intermediate),
                         ("output", layer.output)):
        if name in parts and isinstance(parent.dense, Dense):
            parent.dense = Int8Dense(parent.dense)


def is_quantized(model: nn.Module) -> bool:
    """Whether `quantize_model` has prepared `model`."""
    return any(isinstance(m, _Int8Module) for m in model.modules())


__all__ = ["DEFAULT_PARTS", "PARTS", "QUANTIZE_CHOICES", "Int8Dense", "Int8SelfAttention", "check_quantize", "is_quantized", "quantize_model"]
