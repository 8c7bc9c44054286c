"""Export a checkpoint to ONNX with dynamic batch and sequence axes, and check it against onnxruntime.

The graph takes `input_ids`, `attention_mask` and (except for DistilBERT) `token_type_ids` ([batch, sequence] int64) and returns the
outputs of the checkpoint's class: `last_hidden_state` and `pooler_output` for a BertModel, `logits` for the MLM,
sequence- and token-classification heads, `start_logits` and `end_logits` for QA.

The export traces the model's own forward (while tracing, the model always applies the attention mask instead of
skipping it when nothing is padded, and keeps the padded layout), through a small wrapper that turns its output
object into the tuple of named tensors ONNX wants. The TorchScript-based exporter (`dynamo=False`) is used: it needs no extra packages and
works offline.

`quantize="int8"` writes onnxruntime's dynamic int8 version of the float32 graph
(`onnxruntime.quantization.quantize_dynamic`: int8 weights with one scale per output channel, uint8 activations
quantised at run time): the float32 export is checked as usual, then quantised, and the int8 graph's largest
difference to float32 PyTorch is reported (`ExportReport.int8_diff`) and held to `INT8_TOLERANCE`. It needs
onnxruntime (`pip install 'bertforge[onnx]'`).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from .checkpoint import load_pretrained
from .lora import is_adapter_dir, merge_adapters
from .config import BertConfig
from ..core.errors import BertforgeError
from ..core.io import atomic_write, check_output_file
from ..core.linear import cpu_has_vnni
from . import MODEL_CLASSES, BertModel, BertPreTrainedModel
from ..core.hub import model_path

log = logging.getLogger("bertforge")

INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids"]
DEFAULT_OPSET = 17
#: Largest relative difference of an int8 graph's outputs to float32 PyTorch's (real tokens; a broken quantisation
#: is far beyond it; all-MiniLM-L6-v2 and the tests' tiny models stay under 0.1).
INT8_TOLERANCE = 0.25
#: (batch, sequence) shapes the exported graph is checked on, beside the one it was traced with.
CHECK_SHAPES = [(1, 5), (2, 17), (4, 64), (3, 128)]


class ExportWrapper(nn.Module):
    """input_ids, attention_mask, token_type_ids [B, S] → the model's outputs as a tuple of tensors."""

    def __init__(self, model: BertPreTrainedModel) -> None:
        super().__init__()
        self.model = model
        self.output_names = output_names(model)
        self.eval()  # the exporter restores the wrapper's mode afterwards: it must be eval too

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        return tuple(out[name] for name in self.output_names)


def _probe(model: BertPreTrainedModel) -> dict[str, bool]:
    """The outputs `model` returns without labels, in order → whether each has a sequence axis (it does when its
    second dimension follows the input length: the model is run on two lengths)."""
    shapes = []
    for seq in (3, 4):
        ids = torch.full((1, seq), min(5, model.config.vocab_size - 1), dtype=torch.long)
        with torch.no_grad():
            out = model(ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
        shapes.append({name: tuple(out[name].shape) for name in out.keys()})
    return {name: shape[1:2] != shapes[1][name][1:2] for name, shape in shapes[0].items()}


def output_names(model: BertPreTrainedModel) -> list[str]:
    """The names of the model's outputs (those of its output object: `logits`, `start_logits`, ...)."""
    return list(_probe(model))


def input_names(config: BertConfig) -> list[str]:
    """The graph's inputs: `token_type_ids` only for a model that has token types (not DistilBERT)."""
    return INPUT_NAMES if config.type_vocab_size else INPUT_NAMES[:2]


def dynamic_axes(model: BertPreTrainedModel, names: list[str]) -> dict[str, dict[int, str]]:
    """Batch (and, for per-token tensors, sequence) axes of every input and output."""
    per_token = _probe(model)
    axes = {name: {0: "batch", 1: "sequence"} for name in input_names(model.config)}
    for name in names:
        axes[name] = {0: "batch", 1: "sequence"} if per_token[name] else {0: "batch"}
    return axes


def load_for_export(path: Path, model_class: str = "auto") -> BertPreTrainedModel:
    """The checkpoint as the class its config names (`model_class="auto"`, falling back to BertModel when that
    head's weights are missing), as BertModel (`model_class="none"`), or as the named class."""
    config_file = path / "config.json"
    if not config_file.is_file() and not is_adapter_dir(path):
        raise BertforgeError(f"{path}: not a model directory (no config.json)")
    if model_class == "none":
        return load_pretrained(BertModel, path, quiet=True).eval()
    if model_class != "auto":
        if model_class not in MODEL_CLASSES:
            raise BertforgeError(f"unknown model class {model_class!r}; choose auto, none or one of: {', '.join(MODEL_CLASSES)}")
        model = load_pretrained(MODEL_CLASSES[model_class], path, quiet=True).eval()
        heads_missing = [k for k in model.loading_info.missing_keys if not k.startswith(("bert.pooler.", "pooler."))]  # type: ignore[union-attr]
        if heads_missing:
            raise BertforgeError(f"{path} has no {model_class} head weights ({heads_missing[0]} is missing)")
        return model
    architectures = BertConfig.from_pretrained(path).architectures or []
    cls = next((MODEL_CLASSES[a] for a in architectures if a in MODEL_CLASSES), BertModel)
    model = load_pretrained(cls, path, quiet=True).eval()
    if cls is not BertModel and model.loading_info.missing_keys:  # type: ignore[union-attr]
        log.warning("%s: config names %s but its head weights are missing; exporting BertModel", path, cls.__name__)
        model = load_pretrained(BertModel, path, quiet=True).eval()
    return model


@dataclass
class ExportReport:
    path: Path
    model_class: str
    outputs: list[str]
    max_diff: float  # largest |onnxruntime - torch| / max(1, |torch|) over the checked shapes, real tokens only
    shapes: list[tuple[int, int]]
    quantize: str | None = None  # "int8": the file holds onnxruntime's dynamic int8 graph
    int8_diff: float = float("nan")  # the int8 graph's max_diff to float32 PyTorch (checked exports)


def sample_inputs(batch: int, seq: int, config: BertConfig, seed: int) -> dict[str, Tensor]:
    """Random ids with ragged lengths (every row keeps at least 2 tokens), padded with the model's pad id, and
    both segment ids where the model has two token types."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)
    ids[ids == config.pad_token_id] = 4  # a real token is never the pad id (RoBERTa counts positions by it)
    lengths = torch.randint(min(2, seq), seq + 1, (batch,), generator=g)
    lengths[0] = seq
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    types = ((torch.arange(seq)[None, :] >= (lengths[:, None] // 2)) & mask.bool()).long()
    if config.type_vocab_size < 2:
        types.zero_()
    inputs = {"input_ids": ids.masked_fill(mask == 0, config.pad_token_id), "attention_mask": mask, "token_type_ids": types}
    return {name: inputs[name] for name in input_names(config)}


def export_onnx(
    model: BertPreTrainedModel | str | Path,
    out: str | Path,
    *,
    model_class: str = "auto",
    opset: int = DEFAULT_OPSET,
    check: bool = True,
    tolerance: float = 1e-4,
    quantize: str | None = None,
) -> ExportReport:
    """Write `out` (.onnx) and, with `check`, compare onnxruntime to PyTorch on several (batch, sequence) shapes.
    `quantize="int8"`: write onnxruntime's dynamic int8 graph instead (see the module docstring).

    Raises BertforgeError when the check fails (the file is not written then).
    """
    out = Path(out)
    model = _model_to_export(model, out, model_class, quantize)
    wrapper = ExportWrapper(model)
    config = model.config
    example = sample_inputs(2, min(16, config.max_sequence_length), config, seed=0)
    shapes = [(b, min(s, config.max_sequence_length)) for b, s in CHECK_SHAPES]
    report = ExportReport(out, type(model).__name__, wrapper.output_names, float("nan"), shapes, quantize)

    def export(path: Path) -> None:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracer chatter about shapes read as Python ints
            torch.onnx.export(
                wrapper,
                tuple(example.values()),
                str(path),
                input_names=list(example),
                output_names=wrapper.output_names,
                dynamic_axes=dynamic_axes(model, wrapper.output_names),
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
        if check:
            report.max_diff = check_onnx(path, wrapper, shapes, tolerance)

    def write(tmp: Path) -> None:
        if not quantize:
            return export(tmp)
        fp32 = tmp.with_name(tmp.name + ".fp32")  # beside the temporary file, removed whatever happens
        try:
            export(fp32)
            quantize_onnx(fp32, tmp)
        finally:
            fp32.unlink(missing_ok=True)
        if check:
            report.int8_diff = check_onnx(tmp, wrapper, shapes, INT8_TOLERANCE)

    atomic_write(out, write)
    return report


def _model_to_export(model: BertPreTrainedModel | str | Path, out: Path, model_class: str,
                     quantize: str | None) -> BertPreTrainedModel:
    """`model` in eval mode (loaded as `model_class` when it is a directory), once `out` and `quantize` are checked."""
    if out.suffix != ".onnx":
        raise BertforgeError(f"{out}: the output file name must end in .onnx")
    if quantize is not None:
        _check_int8_export(quantize)
    if not isinstance(model, nn.Module):
        path = model_path(model)
        if not path.is_dir():
            raise BertforgeError(f"{path}: no such model directory")
        check_output_file(out, model=path)
        model = load_for_export(path, model_class)
    return merge_adapters(model).eval()  # a LoRA directory's adapters: in the weights, one plain graph


def _check_int8_export(quantize: str) -> None:
    if quantize != "int8":
        raise BertforgeError(f"export-onnx: quantize must be int8 (or none), got {quantize!r}")
    try:
        import onnxruntime.quantization  # noqa: F401
    except ImportError:
        raise BertforgeError("export-onnx --quantize int8 needs onnxruntime's quantization tools: "
                             "pip install 'bertforge[onnx]' (or onnxruntime)") from None


def quantize_onnx(source: Path, target: Path) -> None:
    """onnxruntime's dynamic int8 quantisation of the float32 graph `source` into `target`: the MatMul weights as
    int8 with one scale per output channel; 7-bit activations where the CPU lacks VNNI (see
    `bertforge.core.linear.cpu_has_vnni`), as onnxruntime advises."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    advice = _DropMessage("pre-processing before quantization")  # its advice to run shape inference first
    root.addFilter(advice)
    try:
        quantize_dynamic(source, target, op_types_to_quantize=["MatMul"], per_channel=True,
                         reduce_range=not cpu_has_vnni(), weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(advice)


class _DropMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def check_onnx(path: Path, wrapper: ExportWrapper, shapes: list[tuple[int, int]], tolerance: float) -> float:
    """Largest |onnxruntime - torch| / max(1, max |torch|) over `shapes` (padding positions left out); raises
    BertforgeError above `tolerance`."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise BertforgeError("checking the export needs onnxruntime (pip install onnxruntime), or skip the check") from None
    try:
        import onnx

        onnx.checker.check_model(str(path))
    except ImportError:
        pass
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for seed, (batch, seq) in enumerate(shapes, start=1):
        inputs = sample_inputs(batch, seq, wrapper.model.config, seed)
        with torch.no_grad():
            expected = wrapper(**inputs)
        got = session.run(None, {k: v.numpy() for k, v in inputs.items()})
        real = inputs["attention_mask"].bool().numpy()
        for name, want, have in zip(wrapper.output_names, expected, got):
            want = want.numpy()
            if have.shape != want.shape:
                raise BertforgeError(f"ONNX output {name} has shape {have.shape} for input {batch}x{seq}, expected {want.shape}")
            diff = np.abs(have - want)
            if want.ndim >= 2 and want.shape[1] == seq:  # per-token output: compare real tokens only
                diff = diff[real]
            scale = max(1.0, float(np.abs(want).max()))
            worst = max(worst, float(diff.max()) / scale)
    if worst > tolerance:
        raise BertforgeError(f"the ONNX graph disagrees with PyTorch (max relative difference {worst:.2e} > {tolerance})")
    return worst


__all__ = ["ExportReport", "ExportWrapper", "check_onnx", "dynamic_axes", "export_onnx", "load_for_export",
           "quantize_onnx"]
