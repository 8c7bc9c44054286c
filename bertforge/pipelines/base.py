"""What every pipeline shares: loading, tokenizing in the background, length-sorted packed batches, order.

A pipeline turns inputs into *features* (token-id sequences; one per input, or several for QA windows), runs the
features through the model in batches of similar length with no padding (`BertModel.forward_packed`), hands each
batch's hidden states to the task's head, and finally folds each input's feature outputs into its result.

Inputs are processed in chunks: while chunk k is computed, chunk k+1 is tokenized, sorted and packed in a
background thread. Results come back in input order.

A call takes transformers' call-time options, for that call only: `fill(texts, top_k=3)`. Each pipeline class
declares them in two tables, checked here (`Pipeline.with_options`): `call_options`, the settings a call may
change (each set by the class's `set_<name>` method, which its constructor uses too), and `refused_options`,
transformers' options that have no bertforge setting, each with where it goes instead. Anything else is refused
with the list of what a call takes.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
from torch import Tensor

from ..model.checkpoint import load_pretrained
from ..model.lora import load_adapted
from ..data.corpus import calibration_ids
from ..core.errors import BertforgeError
from ..model import BertPreTrainedModel
from ..model.attention import PackedBatch, bucket_size, pack
from ..core.linear import BACKENDS, linear_backend, onednn_available
from ..model.quantize import check_quantize, is_quantized, quantize_model
from ..core.system import configure_threads, inference_device, reuse_freed_memory
from ..core.hub import model_path
from ..training.step import autocast, pick_precision

log = logging.getLogger("bertforge")

#: Inputs tokenized (and sorted by length) together; larger chunks sort better, smaller ones start sooner.
CHUNK_SIZE = 2048
#: Show a progress bar (on a terminal) from this many inputs on, unless `progress` says otherwise.
PROGRESS_MIN_INPUTS = 512


#: `precision=` of the pipelines (and --precision of the inference commands).
INFERENCE_PRECISIONS = ("fp32", "bf16")


def inference_precision(precision: str, quantize: str | None, device: torch.device, task: str) -> torch.dtype | None:
    """The autocast dtype of a pipeline's encoder (None: as the device runs it, float32 on a CPU)."""
    if precision not in INFERENCE_PRECISIONS:
        raise BertforgeError(f"{task}: precision {precision!r}; choose {' or '.join(INFERENCE_PRECISIONS)}")
    if precision == "fp32":
        return None
    if quantize is not None:
        raise BertforgeError(f"{task}: precision bf16 is for float models; quantize={quantize!r} runs int8 layers")
    if device.type != "cpu":
        raise BertforgeError(f"{task}: precision bf16 is the CPU's (on {device.type} the model runs in float16)")
    pick_precision("bf16", device, training=False)  # warns on a CPU without bf16 units
    return torch.bfloat16


@dataclass
class Feature:
    """One sequence for the model. `item` is the input it belongs to (its index within the chunk)."""

    item: int
    input_ids: list[int]
    token_type_ids: list[int] | None = None
    extra: Any = None  # what the task's postprocessing needs (offsets, windows, ...)


@dataclass
class Chunk:
    """A slice of the inputs, tokenized, with its features grouped into packed batches."""

    inputs: list[Any]
    features: list[Feature]
    batches: list[tuple[list[int], PackedBatch]] = field(default_factory=list)  # (feature indices, batch)
    truncated: int = 0  # inputs cut to max_length


def make_batches(lengths: Sequence[int], max_batch_tokens: int, batch_size: int) -> list[list[int]]:
    """Indices of the features in batches: longest first, each batch at most `max_batch_tokens` real tokens (or one
    sequence) and `batch_size` sequences. Within a batch the lengths are non-increasing, as packing needs."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    tokens = 0
    for i in order:
        if current and (tokens + lengths[i] > max_batch_tokens or len(current) >= batch_size):
            batches.append(current)
            current, tokens = [], 0
        current.append(i)
        tokens += lengths[i]
    if current:
        batches.append(current)
    return batches


class Pipeline:
    """Base class. Subclasses set `task`, `model_class`, and implement `featurize`, `head` and `postprocess`.

    Args:
        model: a model directory (config.json, weights, tokenizer files), or a loaded bertforge model (then pass
            `tokenizer` too).
        tokenizer: a `bertforge.Tokenizer`; by default loaded from the model directory.
        max_length: longest input in tokens, special tokens included; longer inputs are truncated with a
            warning (QA windows them instead). Default: the model's limit.
        max_batch_tokens: real tokens per batch (no padding is computed, so this is the work per batch).
        batch_size: most sequences per batch.
        progress: show a progress bar; None: for long inputs when writing to a terminal.
        num_threads: PyTorch intra-op threads; None: PyTorch's default, capped at the CPUs this process may use.
        backend: matrix-multiply kernels: "auto" (oneDNN's fused kernels on CPU when available), "onednn" or
            "aten" (`F.linear`, what the model itself uses).
        quantize: "int8" for int8 dense layers in the encoder (CPU only; `bertforge.model.quantize`); a model object
            passed in is copied first, not changed. None: float32. int8 also asks glibc to keep freed memory for
            reuse in this process (`bertforge.core.system.reuse_freed_memory`, what the commands and training do;
            BERTFORGE_MALLOC=default declines): an int8 layer writes several fresh tensors per call, and under
            glibc's default each is new pages (all-MiniLM-L6-v2 int8 on 2,000 SST-2 sentences, 2 threads,
            2026-11-27: 1107-1130 sentences/s without, 1271-1375 with).
        adapter: a PEFT LoRA directory (`bertforge.model.lora`) to run on the model directory `model` (a LoRA
            directory as `model` finds its base itself, from its `adapter_config.json`).
        device: "cpu" (the default: packed batches, oneDNN kernels), "cuda", "cuda:N", "mps" or "auto" (a GPU if
            there is one). On CUDA the model runs in float16 (SDPA's fast kernels); results come back as float32.
            A model object passed in is moved there.
        precision: "fp32" (the default on a CPU: transformers' numbers), or "bf16": the encoder under bf16
            autocast on the CPU (its matrix multiplies in bf16, fast on CPUs with AVX512-BF16 or AMX; emulated,
            slowly, elsewhere, with a warning), the head and results in float32. Not with quantize.
    """

    task: ClassVar[str] = ""
    model_class: ClassVar[type[BertPreTrainedModel]]
    #: The keyword arguments a call takes for itself (`fill(texts, top_k=3)`): each is set, on the call's own copy
    #: of the pipeline, by the method `set_<name>` (the constructor's check). In the order they are set.
    call_options: ClassVar[tuple[str, ...]] = ("batch_size", "max_batch_tokens", "max_length", "progress", "truncation")
    #: transformers' call-time options that have no setting here: name -> where it goes instead (a message).
    refused_options: ClassVar[Mapping[str, str]] = {
        "num_workers": "inputs are tokenized in a background thread already; set threads with "
                       "pipeline(..., num_threads=N)",
        "padding": "batches are packed with no padding, so results do not depend on it; leave it out",
    }
    #: Named keyword arguments of the class's own `__call__` (for the message listing what a call takes).
    call_arguments: ClassVar[tuple[str, ...]] = ()
    #: `forward_packed`'s max_padding: 0 keeps each result independent of the rest of its batch, bit for bit.
    attention_padding: ClassVar[float] = 0.0
    #: Encoder blocks to run (`forward_packed`'s depth); None: all. The embed pipeline's `layer` sets it.
    depth: int | None = None

    def __init__(
        self,
        model: str | os.PathLike[str] | BertPreTrainedModel,
        *,
        tokenizer: Any = None,
        max_length: int | None = None,
        max_batch_tokens: int = 4096,
        batch_size: int = 256,
        progress: bool | None = None,
        num_threads: int | None = None,
        backend: str = "auto",
        quantize: str | None = None,
        device: str | None = None,
        adapter: str | os.PathLike[str] | None = None,
        precision: str = "fp32",
    ) -> None:
        self.device = inference_device(device)
        configure_threads(num_threads)
        check_quantize(quantize, what=self.task)
        self.autocast_dtype = inference_precision(precision, quantize, self.device, self.task)
        if quantize is not None and self.device.type != "cpu":
            raise BertforgeError(f"{self.task}: int8 (quantize) runs on CPU; leave out quantize or device {device!r}")
        if quantize is not None:
            reuse_freed_memory()
        if isinstance(model, BertPreTrainedModel):
            if adapter is not None:
                raise BertforgeError(f"{self.task}: adapter= is for a model directory; put adapters on a model "
                                     "object with bertforge.model.lora.load_adapter")
            if tokenizer is None:
                raise BertforgeError(f"{self.task}: pass tokenizer= together with a model object")
            self.model_dir: Path | None = None
            self.model = model.eval()
            self.check_model(self.model, type(model).__name__)
        else:
            path = model_path(model)
            if not path.is_dir():
                raise BertforgeError(f"{path}: no such model directory")
            self.model_dir = path
            self.model = self.load(path, None if adapter is None else model_path(adapter))
        if tokenizer is None:
            from ..tokenizer import Tokenizer

            tokenizer = Tokenizer.from_pretrained(cast(Path, self.model_dir))  # a model object comes with tokenizer=
        self.tokenizer = tokenizer
        if quantize is not None and not is_quantized(self.model):
            self.model = quantize_model(copy.deepcopy(self.model) if self.model_dir is None else self.model, quantize,
                                        calibration=calibration_ids(tokenizer))
        self.quantize = "int8" if is_quantized(self.model) else None  # what the model runs in
        if self.device.type != "cpu":  # half precision on a GPU: its fast kernels (SDPA's included)
            self.model = self.model.to(self.device, dtype=torch.float16 if self.device.type == "cuda" else None)
        config = self.model.config
        tokenizer.check_fits_model(config.vocab_size, str(self.model_dir) if self.model_dir else "the model")
        limit = min(config.max_sequence_length, tokenizer.model_max_length)
        self.length_limit = limit  # the most max_length may be
        self.set_max_length(limit if max_length is None else max_length)
        self.set_max_batch_tokens(max_batch_tokens)
        self.set_batch_size(batch_size)
        self.set_progress(progress)
        if backend not in BACKENDS:
            raise BertforgeError(f"{self.task}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        weight = self.model.input_embeddings()
        if backend == "onednn" and not (weight.device.type == "cpu" and weight.dtype == torch.float32 and onednn_available()):
            raise BertforgeError(
                f"{self.task}: the oneDNN backend needs float32 weights on CPU and a PyTorch built with oneDNN"
            )
        self.backend = backend

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        unset = [name for name in cls.call_options if not callable(getattr(cls, f"set_{name}", None))]
        both = set(cls.call_options) & set(cls.refused_options)
        if unset or both:
            raise TypeError(f"{cls.__name__}: call_options without a set_<name> method: {unset}; "
                            f"both taken and refused: {sorted(both)}")

    # ------------------------------------------------------------------ settings a call may change

    def set_max_length(self, max_length: Any) -> None:
        self.max_length = self.check_max_length(max_length, self.length_limit)

    def set_max_batch_tokens(self, max_batch_tokens: Any) -> None:
        self.max_batch_tokens = self.check_positive("max_batch_tokens", max_batch_tokens)

    def set_batch_size(self, batch_size: Any) -> None:
        self.batch_size = self.check_positive("batch_size", batch_size)

    def set_progress(self, progress: Any) -> None:
        if progress is not None and not isinstance(progress, bool):
            raise BertforgeError(f"{self.task}: progress must be True, False or None, got {progress!r}")
        self.progress = progress

    def set_truncation(self, truncation: Any) -> None:
        """transformers' `truncation=True` is what always happens here; anything else is refused."""
        if truncation is not True and truncation != "longest_first":
            raise BertforgeError(f"{self.task}: `truncation` is always on here: texts are cut at max_length "
                                 f"({self.max_length} tokens); set it with max_length=N, got truncation={truncation!r}")

    def check_positive(self, name: str, value: Any) -> int:
        """`value`, a positive integer, or a BertforgeError naming `name`."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BertforgeError(f"{self.task}: {name} must be a positive integer, got {value!r}")
        return value

    def with_options(self, options: Mapping[str, Any]) -> Pipeline:
        """The pipeline for one call with `options` (the call's keyword arguments): itself when there are none,
        else a shallow copy with them set, checked as the constructor checks them. The pipeline itself is not
        changed, so calls from several threads (the server's) never see each other's options."""
        if not options:
            return self
        for name in options:
            if name in self.refused_options:
                raise BertforgeError(f"{self.task}: `{name}` is not supported; {self.refused_options[name]}")
            if name not in self.call_options:
                takes = ", ".join((*self.call_arguments, *self.call_options))
                raise BertforgeError(f"{self.task}: unknown option `{name}`; a call takes: {takes}")
        pipe = copy.copy(self)
        for name in self.call_options:
            if name in options:
                getattr(pipe, f"set_{name}")(options[name])
        return pipe

    # ------------------------------------------------------------------ loading and checks

    @staticmethod
    def check_max_length(max_length: Any, limit: int) -> int:
        """`max_length`, an integer in 3..`limit` (the model's and the tokenizer's limit), or a BertforgeError."""
        if not isinstance(max_length, int) or isinstance(max_length, bool) or not 2 < max_length <= limit:
            raise BertforgeError(f"max_length must be an integer in 3..{limit} for this model, got {max_length!r}")
        return max_length
    def load(self, path: Path, adapter: Path | None = None) -> BertPreTrainedModel:
        """Load `model_class` from `path` (a checkpoint, or a PEFT adapter directory with its base found from it)
        with the adapter directory `adapter` on it, and check that the model has what the task needs."""
        if adapter is not None:
            model = load_adapted(self.model_class, adapter, base=path, quiet=True).eval()
        else:
            model = load_pretrained(self.model_class, path, quiet=True).eval()  # the heads are checked below
        self.check_model(model, str(path))
        return model

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        """Raise BertforgeError when the task's head was not in the checkpoint (see `loading_info`)."""

    @staticmethod
    def missing(model: BertPreTrainedModel, prefix: str) -> bool:
        """Whether weights named `prefix...` were initialised because the checkpoint lacked them."""
        from ..model.checkpoint import missing_weights

        return missing_weights(model, prefix)

    # ------------------------------------------------------------------ task hooks
    def featurize(self, inputs: list[Any]) -> tuple[list[Feature], int]:
        """Tokenize a chunk of inputs into features; returns them and how many inputs were truncated."""
        raise NotImplementedError

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[Any]:
        """The task's outputs for each sequence of `batch`, from its hidden states [T, H]."""
        raise NotImplementedError

    def postprocess(self, item: Any, outputs: list[Any], features: list[Feature]) -> Any:
        """An input's result from the outputs of its features."""
        raise NotImplementedError

    def check_input(self, item: Any, index: int) -> None:
        """Raise BertforgeError for an input the task cannot take (`index` names it in the message)."""
        if not isinstance(item, str):
            raise BertforgeError(
                f"{self.task}: input {index} is a {type(item).__name__} {_preview(item)}, expected a string"
            )

    # ------------------------------------------------------------------ shared tokenization
    def encode(self, texts: list[Any], pairs: list[Any] | None = None, **kwargs: Any) -> tuple[dict[str, list], int]:
        """Tokenize like the tokenizer's batch call; inputs over `max_length` are truncated ("longest_first",
        as transformers does). Returns the encodings and how many inputs were cut."""
        if not texts:
            return {"input_ids": [], "token_type_ids": []}, 0
        enc = self.tokenizer(texts, pairs, **kwargs)
        long = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > self.max_length]
        if long:
            cut = self.tokenizer(
                [texts[i] for i in long],
                [pairs[i] for i in long] if pairs is not None else None,
                truncation=True,
                max_length=self.max_length,
                **kwargs,
            )
            for key in enc:
                for j, i in enumerate(long):
                    enc[key][i] = cut[key][j]
        return enc, len(long)

    # ------------------------------------------------------------------ running
    def features(self, inputs: list[Any], offset: int = 0) -> tuple[list[Feature], int]:
        """Check and tokenize `inputs` (a chunk; `offset` is its first input's index, for messages) into the
        features `run_features` takes; returns them and how many inputs were truncated to max_length."""
        for i, item in enumerate(inputs):
            self.check_input(item, offset + i)
        return self.featurize(inputs)

    def batch(self, chunk: Chunk) -> Chunk:
        """Group a chunk's features into packed batches of similar length (filling `chunk.batches`)."""
        features = chunk.features
        lengths = [len(f.input_ids) for f in features]
        for indices in make_batches(lengths, self.max_batch_tokens, self.batch_size):
            with_types = any(features[i].token_type_ids is not None for i in indices)
            batch = pack(
                [features[i].input_ids for i in indices],
                [features[i].token_type_ids or [0] * lengths[i] for i in indices] if with_types else None,
            )
            chunk.batches.append((indices, batch))
        return chunk

    def prepare(self, inputs: list[Any], offset: int) -> Chunk:
        """Tokenize and pack one chunk (runs in the background thread)."""
        features, truncated = self.features(inputs, offset)
        return self.batch(Chunk(inputs, features, truncated=truncated))

    def run_features(self, inputs: Sequence[Any], features: list[Feature]) -> list[Any]:
        """Each input's result, in order, from features already made by `features(inputs)` (`feature.item` indexes
        `inputs`): packs and computes in this thread, no tokenizing. For callers that tokenize ahead, as the server
        does to size its batches."""
        if any(not 0 <= f.item < len(inputs) for f in features):
            raise BertforgeError(f"{self.task}: a feature names an input outside the {len(inputs)} given")
        return self.compute(self.batch(Chunk(list(inputs), features)))

    def compute(self, chunk: Chunk) -> list[Any]:
        """Each input's result for a prepared chunk, in input order."""
        outputs: list[Any] = [None] * len(chunk.features)
        bert = self.model.base_model
        with torch.inference_mode(), linear_backend(self.backend):
            for indices, batch in chunk.batches:
                batch = batch.to(self.device)
                padded = batch.padded_to(bucket_size(batch.tokens))  # sizes that repeat: memory stays bounded
                with autocast(self.device, self.autocast_dtype):
                    hidden = bert.forward_packed(padded, self.attention_padding, self.depth)[: batch.tokens]  # [T, H]
                if self.autocast_dtype is not None:
                    hidden = hidden.float()  # the head in float32
                for i, out in zip(indices, self.head(batch, hidden, [chunk.features[i] for i in indices])):
                    outputs[i] = out
        by_item: list[list[int]] = [[] for _ in chunk.inputs]
        for i, feature in enumerate(chunk.features):
            by_item[feature.item].append(i)
        return [
            self.postprocess(item, [outputs[i] for i in idx], [chunk.features[i] for i in idx])
            for item, idx in zip(chunk.inputs, by_item)
        ]

    def stream(self, inputs: Iterable[Any], total: int | None = None) -> Iterator[Any]:
        """Results one by one, in input order, for any iterable of inputs (read CHUNK_SIZE at a time)."""
        if total is None and hasattr(inputs, "__len__"):
            total = len(inputs)  # type: ignore[arg-type]
        bar = self._progress_bar(total)
        truncated = 0
        iterator = iter(inputs)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertforge-tokenize") as pool:
            offset = 0

            def submit() -> Future[Chunk] | None:
                nonlocal offset
                items = list(islice(iterator, CHUNK_SIZE))
                if not items:
                    return None
                future = pool.submit(self.prepare, items, offset)
                offset += len(items)
                return future

            pending = submit()
            try:
                while pending is not None:
                    chunk = pending.result()
                    pending = submit()  # tokenize the next chunk while this one runs
                    truncated += chunk.truncated
                    results = self.compute(chunk)
                    if bar is not None:
                        bar.update(len(results))
                    yield from results
            finally:
                if pending is not None:
                    pending.cancel()
                if bar is not None:
                    bar.close()
                if truncated:
                    self.warn_truncated(truncated)

    def warn_truncated(self, count: int) -> None:
        log.warning(
            "%s: %d input%s longer than max_length=%d tokens %s truncated",
            self.task, count, "s" if count != 1 else "", self.max_length, "were" if count != 1 else "was",
        )

    def _progress_bar(self, total: int | None) -> Any:
        if self.progress is False or (self.progress is None and (total or 0) < PROGRESS_MIN_INPUTS):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=self.task, unit="input", disable=None if self.progress is None else False)

    def __call__(self, inputs: Any, **options: Any) -> Any:
        """One input → its result; a list (or other sequence) of inputs → a list of results. `options`: settings
        for this call only (`call_options`), as transformers' pipelines take them: `fill(texts, top_k=3)`."""
        return self.with_options(options).run(inputs)

    def run(self, inputs: Any) -> Any:
        """What a call returns, with this pipeline's settings."""
        if self.is_single(inputs):
            return next(iter(self.stream([inputs])))
        self.check_collection(inputs)
        return list(self.stream(inputs))

    def check_collection(self, inputs: Any) -> None:
        """Refuse what is not one input and not an ordered collection of inputs: bytes, a number, None, a dict this
        task does not take as one input (iterating it would run its keys), a set (no order to answer in)."""
        if isinstance(inputs, (str, bytes, bytearray, Mapping, Set)) or not isinstance(inputs, Iterable):
            raise BertforgeError(
                f"{self.task}: expected {self.input_description} or a list of them, got {type(inputs).__name__} "
                f"{_preview(inputs)}"
            )

    #: What one input is, for messages.
    input_description: ClassVar[str] = "a string"

    def is_single(self, inputs: Any) -> bool:
        """Whether `inputs` is one input rather than a collection of them."""
        return isinstance(inputs, str)

    def __repr__(self) -> str:
        where = self.model_dir if self.model_dir is not None else type(self.model).__name__
        return f"{type(self).__name__}(model={str(where)!r}, max_length={self.max_length})"


class VectorPipeline(Pipeline):
    """A pipeline that makes one float32 vector of `vector_size()` numbers from each text, one feature a text:
    one text → [size]; a list of texts → [n, size] (`embed`'s pooled sentences, `sparse-embed`'s vocabulary)."""

    def vector_size(self) -> int:
        raise NotImplementedError

    def featurize(self, inputs: list[str]) -> tuple[list[Feature], int]:
        enc, truncated = self.encode(inputs)
        return [Feature(i, ids) for i, ids in enumerate(enc["input_ids"])], truncated

    def postprocess(self, item: str, outputs: list[Any], features: list[Feature]) -> Any:
        return outputs[0]

    def run(self, inputs: Any) -> Any:
        if self.is_single(inputs):
            return super().run(inputs)
        import numpy as np

        rows = super().run(inputs)
        return np.stack(rows) if rows else np.zeros((0, self.vector_size()), dtype=np.float32)


def _preview(value: Any) -> str:
    """A short repr of an input, for messages."""
    text = repr(value)
    return f"({text[:60]}...)" if len(text) > 63 else f"({text})"
