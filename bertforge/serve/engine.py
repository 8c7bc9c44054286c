"""The model behind the server: `Engine` loads its pipelines in the batcher's thread and tokenizes each request
once, on arrival, into their features."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ..core.errors import BertforgeError
from ..model.families import FAMILIES
from ..model.pooling import Dense, read_dense
from .batcher import Batcher
from .config import ServeConfig
from .errors import ApiError, invalid
from .metrics import Metrics
from ..core.hub import model_path

if TYPE_CHECKING:
    from ..pipelines.classification import TextClassificationPipeline
    from ..pipelines.embed import EmbedPipeline

#: The default bound on one input's characters, per token of the model's max length: English averages 4-5
#: characters a token, so a text cut there keeps every token the model reads unless it averages more than 16.
CHARS_PER_TOKEN = 16
#: What the client of a route that reads "truncate" can do about an input too long (/v1/embeddings reads none).
TRUNCATE_HINT = 'shorten it, or send "truncate": true to cut it'


log = logging.getLogger("bertforge")


def _config(model_dir: Path) -> dict[str, Any]:
    """The directory's config.json ({} where it cannot be read: the pipeline will name the problem)."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _architectures(model_dir: Path) -> list[str]:
    """The "architectures" of the directory's config.json ([] where it names none or cannot be read)."""
    architectures = _config(model_dir).get("architectures")
    return [str(a) for a in architectures] if isinstance(architectures, list) else []


def detect_task(model_dir: Path) -> str:
    """"classify" for a sequence-classification checkpoint, else "embed"."""
    if any(a.endswith("ForSequenceClassification") for a in _architectures(model_dir)):
        return "classify"
    return "embed"


#: the internal classes saved with an MLM head (a family's own names are read through it: ELECTRA's
#: ElectraForPreTraining is its discriminator, which has none)
MLM_CLASSES = ("BertForMaskedLM", "BertForPreTraining")


def is_splade(model_dir: Path) -> bool:
    """Whether the directory is a sparse (SPLADE) sentence-transformers model: its modules.json names a
    SpladePooling module (sentence-transformers' SparseEncoder)."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(modules, list) and any(isinstance(m, dict) and "SpladePooling" in str(m.get("type", ""))
                                             for m in modules)


def has_mlm_head(model_dir: Path) -> bool:
    """Whether the checkpoint was saved with an MLM head (BertForMaskedLM, RobertaForMaskedLM, AlbertForPreTraining,
    ...): what /embed_sparse (SPLADE) reads."""
    model_type = _config(model_dir).get("model_type", "bert")
    member = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if member is None:  # an unsupported family: the pipeline will name it
        return False
    return any(member.internal_architecture(a) in MLM_CLASSES for a in _architectures(model_dir))


def after_dense(dense: Dense, runner: Any) -> Any:
    """`runner` (a pipeline's `run_features`) with `dense` applied to its pooled rows (TEI's --dense-path)."""
    def run(items: list[Any], features: list[Any]) -> list[Any]:
        results = runner(items, features)
        return list(dense(torch.from_numpy(np.stack(results))).numpy()) if len(results) else results

    return run


class Engine:
    """The pipelines of one model, the batcher in front of them, and what the endpoints need to know.

    `pipelines[kind]` is the pipeline a request kind runs: "embed" for an embedding model; "classify" and
    "classify_raw" (scores, logits) and "rerank" and "rerank_raw" (a cross-encoder's ranking) for a
    sequence-classification model, all on one copy of the weights. A request is tokenized once, on arrival, into the
    pipeline's features (their lengths size the batches); the worker only packs and computes them.

    All of the model's torch work (loading, int8 calibration, the warm-up, every batch) runs in the batcher's one
    thread, from construction on. Had another thread run a parallel torch op first (loading does), OpenMP would
    keep a second team of threads for it; with more OpenMP threads than CPUs, GNU OpenMP's idle workers stop
    spinning and sleep, and every op of a small batch then waits for a wake-up. Measured (all-MiniLM-L6-v2, one
    sentence, 2 threads on 2 cores, 2026-11-27): 14 ms a call in a worker thread after loading in the main one,
    7 ms with everything in one thread.
    """

    def __init__(self, config: ServeConfig) -> None:
        model_dir = model_path(config.model, config.revision)
        if not model_dir.is_dir():
            raise BertforgeError(f"{model_dir}: no such model directory")
        self.precision = self._precision(config)
        from ..core.system import inference_device

        self.device_type = inference_device(config.device).type  # TEI's x-compute-type
        self.config = config
        self.model_name = config.model_name or (model_dir.resolve().name if Path(config.model).exists() else config.model)
        self.task = detect_task(model_dir) if config.task == "auto" else config.task
        # /embed_sparse: a SPLADE model, or any masked-LM checkpoint with --pooling splade (TEI's rule)
        self.sparse = self.task == "embed" and (config.pooling == "splade" or is_splade(model_dir))
        if self.sparse and not has_mlm_head(model_dir):
            raise BertforgeError(f"serve: {'--pooling splade' if config.pooling == 'splade' else 'a SPLADE model'} "
                                 f"needs a masked-LM checkpoint (an MLM head); {model_dir} has none")
        if self.task == "classify" and config.pooling is not None:
            raise BertforgeError("serve: --pooling is for embedding models, not classification")
        self.dtype = config.dtype or "float32"
        from ..core.system import available_cpus

        self.tokenization_workers = config.tokenization_workers or available_cpus()
        self.metrics = Metrics()
        self.batcher = Batcher({}, config.max_batch_tokens, config.max_queue, self.metrics,
                               max_batch_inputs=config.max_batch_requests)
        self.batcher.start(setup=lambda: self._load(model_dir))  # raises what loading raised

    def _load(self, model_dir: Path) -> None:
        """Load the pipelines and warm them up, in the batcher's thread (see the class docstring)."""
        from ..pipelines import pipeline
        from ..model.pooling import sentence_transformers_settings

        config = self.config
        common = dict(max_length=config.max_length, max_batch_tokens=config.max_batch_tokens,
                      batch_size=config.max_batch_requests or config.max_batch_tokens, progress=False,
                      num_threads=config.num_threads, device=config.device, precision=self.precision)
        pipelines: dict[str, Any] = {}
        main: EmbedPipeline | TextClassificationPipeline  # the pipeline of /embed, or of /predict
        if self.task == "embed":
            settings = sentence_transformers_settings(model_dir)
            self.default_normalize = bool(settings.get("normalize", False))
            self.prompts = dict(settings.get("prompts", {}))
            self.default_prompt = self._default_prompt(settings.get("default_prompt_name"))
            source: Any = model_dir
            tokenizer, sparse = None, None
            if self.sparse:
                # /embed_sparse: SPLADE from the MLM head. One copy of the weights: the masked-LM model, loaded (and
                # quantized) once, embeds with its encoder for /embed and /embed_all.
                sparse = pipeline("sparse-embed", model=model_dir, quantize=config.quantize, **common)
                pipelines["embed_sparse"] = sparse
                source, tokenizer = sparse.model, sparse.tokenizer
            # Unnormalised rows: each request says whether it wants them normalised.
            pooling = None if config.pooling == "splade" else config.pooling
            embed = cast("EmbedPipeline", pipeline("embed", model=source, tokenizer=tokenizer, settings_from=model_dir,
                                                   pooling=pooling, normalize=False, quantize=config.quantize,
                                                   prompt="", **common))  # prompts: `prompt`, per request
            self.pooling = "splade" if self.sparse else embed.pooling  # /info's model_type
            self.model_kind = "embedding"
            self.hidden_size = embed.vector_size()  # the last Dense module's width, if it has any
            pipelines["embed"] = main = embed
            if sparse is not None:
                sparse.max_length = embed.max_length  # sentence-transformers' max_seq_length too
            # /embed_all: every token's vector, from the same weights (and the same max_length)
            pipelines["embed_all"] = pipeline("feature-extraction", model=embed.model, tokenizer=embed.tokenizer,
                                              **dict(common, max_length=embed.max_length))
        else:
            self.prompts, self.default_prompt = {}, ""
            main = cast("TextClassificationPipeline", pipeline("text-classification", model=model_dir, top_k=None,
                                                               quantize=config.quantize, **common))
            shared = dict(common, model=main.model, tokenizer=main.tokenizer, max_length=main.max_length)
            pipelines["classify"] = main
            pipelines["classify_raw"] = pipeline("text-classification", top_k=None, function_to_apply="none", **shared)
            # /rerank scores as /predict does (TEI): a sigmoid of one logit, else the last label's probability
            pipelines["rerank"] = pipeline("rerank", activation=main.function_to_apply, **shared)
            pipelines["rerank_raw"] = pipeline("rerank", activation="none", **shared)
            self.id2label = main.id2label
            self.function = main.function_to_apply
            self.model_kind = "classifier" if len(self.id2label) > 1 else "reranker"  # TEI's ModelType
            self.hidden_size = main.model.config.hidden_size
        for name, directory in config.adapters.items():
            pipelines.update(self._adapter_pipelines(name, model_path(directory), model_dir, main, common))
        self.pipelines = pipelines
        self.tokenizer = main.tokenizer
        self.max_length = main.max_length
        for pipe in pipelines.values():  # the first call builds kernels and caches: not a client's
            items = ["warm up"] if self.task == "embed" else [("warm", "up")]
            pipe.run_features(items, pipe.features(items)[0])
        runners = {kind: pipe.run_features for kind, pipe in pipelines.items()}
        if config.dense_path is not None and self.task == "embed":
            dense_dir = Path(config.dense_path) if Path(config.dense_path).is_dir() else model_dir / config.dense_path
            listed = [(model_dir / d).resolve() for d in cast("EmbedPipeline", main).declared.get("dense", [])]
            if dense_dir.resolve() in listed:  # the pipeline applies what modules.json lists: not twice
                log.info("serve: --dense-path %s is a Dense module of the model's modules.json: applied once",
                         config.dense_path)
            else:
                dense = read_dense(dense_dir, self.hidden_size, f"serve: --dense-path {config.dense_path}")
                self.hidden_size = dense.out_features
                for kind in [k for k in runners if k == "embed" or k.startswith("embed@")]:
                    runners[kind] = after_dense(dense, runners[kind])
        self.batcher.runners.update(runners)

    def _adapter_pipelines(self, name: str, directory: Path, model_dir: Path, main: Any,
                           common: dict[str, Any]) -> dict[str, Any]:
        """The pipelines of the adapter `name` (a PEFT LoRA directory) on the base model, under `kind@name`: on the
        base's own weights in float32 (`lora.with_adapter`: only the adapters and the head are new), merged into
        a float copy of its own with int8."""
        from ..model import BertForSequenceClassification, BertModel
        from ..model.lora import load_adapted, with_adapter
        from ..pipelines import pipeline

        if not directory.is_dir():
            raise BertforgeError(f"serve: --adapter {name}: {directory}: no such adapter directory")
        quantize = self.config.quantize
        shared = dict(common, tokenizer=main.tokenizer, max_length=main.max_length)
        if self.task == "embed":
            base = main.model.base_model  # the encoder (of the MLM model, where /embed_sparse reads its head)
            model = load_adapted(BertModel, directory, base=model_dir, quiet=True) if quantize else with_adapter(
                base, directory)
            pooling = None if self.config.pooling == "splade" else self.config.pooling
            embed = pipeline("embed", model=model, settings_from=model_dir, pooling=pooling, prompt="",
                             normalize=False, quantize=quantize, **shared)
            return {f"embed@{name}": embed,
                    f"embed_all@{name}": pipeline("feature-extraction", model=embed.model, **shared)}
        model = load_adapted(BertForSequenceClassification, directory, base=model_dir, quiet=True) if quantize \
            else with_adapter(main.model, directory)
        classify: Any = pipeline("text-classification", model=model, top_k=None, quantize=quantize, **shared)
        same = dict(shared, model=classify.model)
        return {f"classify@{name}": classify,
                f"classify_raw@{name}": pipeline("text-classification", top_k=None, function_to_apply="none", **same),
                f"rerank@{name}": pipeline("rerank", activation=classify.function_to_apply, **same),
                f"rerank_raw@{name}": pipeline("rerank", activation="none", **same)}

    def kind(self, kind: str, adapter: Any) -> str:
        """The pipeline a request of `kind` runs with the adapter it names (None: the base model's); an unknown
        name is a 404 naming it and those there are."""
        if adapter is None:
            return kind
        if not isinstance(adapter, str):
            raise invalid(f'"adapter" must be a string, got {type(adapter).__name__}')
        if adapter not in self.config.adapters:
            there = ", ".join(sorted(self.config.adapters)) or "none"
            raise invalid(f"unknown adapter {adapter!r:.80}; this server's adapters: {there}")
        return f"{kind}@{adapter}"

    def stop(self) -> None:
        self.batcher.close(timeout=60)

    @property
    def max_chars(self) -> int:
        """The most characters of one input (each text of a pair) that are tokenized: `max_input_chars`, by default
        `CHARS_PER_TOKEN` for each token the model takes."""
        return self.config.max_input_chars or CHARS_PER_TOKEN * self.max_length

    @staticmethod
    def _precision(config: ServeConfig) -> str:
        """TEI's --dtype as a pipeline precision, or one line saying why it cannot be: float32 (and bfloat16, as
        bf16 autocast) on a CPU; float16 is what a GPU runs, and nothing a CPU runs."""
        from ..core.system import inference_device

        dtype = config.dtype or ("float32" if inference_device(config.device).type == "cpu" else "float16")
        on_cpu = inference_device(config.device).type == "cpu"
        if on_cpu and dtype == "float16":
            raise BertforgeError("serve: --dtype float16 needs a GPU (--device cuda); on a CPU use float32 or "
                                 "bfloat16")
        if not on_cpu and dtype != "float16":
            raise BertforgeError(f"serve: --dtype {dtype}: on {config.device} bertforge runs the model in float16")
        if dtype == "bfloat16" and config.quantize:
            raise BertforgeError("serve: --dtype bfloat16 is for float models; --quantize int8 runs int8 layers")
        return "bf16" if dtype == "bfloat16" else "fp32"

    def _default_prompt(self, model_default: str | None) -> str:
        """The prompt put before every input whose request names none: --default-prompt, the prompt
        --default-prompt-name names, or the model's own default_prompt_name (sentence-transformers'), else none."""
        config = self.config
        if config.default_prompt is not None:
            return config.default_prompt
        name = config.default_prompt_name or model_default
        if name is None:
            return ""
        if name not in self.prompts:
            raise BertforgeError(f"serve: --default-prompt-name is {name!r} but the model's sentence-transformers "
                                 f"prompts are {', '.join(map(repr, self.prompts)) or 'none'}")
        return self.prompts[name]

    def prompt(self, name: str | None) -> str:
        """The prompt text of the request's "prompt_name" (None: the server's default one, maybe none); an unknown
        name is TEI's 422."""
        if name is None:
            return self.default_prompt
        if name not in self.prompts:
            known = ", ".join(map(repr, self.prompts)) or "none (no sentence-transformers prompts)"
            raise invalid(f"`prompt_name` {name!r:.80} was not found in the Sentence Transformers prompts. "
                          f"Available prompts: {known}")
        return self.prompts[name]

    def tokenize(self, kind: str, items: list[Any], truncate: bool, hint: str = TRUNCATE_HINT,
                 left: bool = False, prompt: str = "") -> tuple[list[Any], list[Any], int]:
        """A request's inputs as read (each cut to `max_chars` with `truncate`), their features for the pipeline of
        `kind`, and their tokens (special tokens included; inputs cut to max_length with `truncate`, keeping their
        first tokens, or their last ones with `left`). An input is a text, a (text, text_pair) tuple, or a list of
        token ids (TEI's `InputType::Ids`: used as they are, no special tokens added). `prompt` goes before each
        text. An input too long without `truncate` gets TEI's 422 whose message ends in `hint`, what the client can
        do on its route; one past `max_chars` gets it before any tokenizing, so a request costs in proportion to
        what is computed."""
        if left and any(isinstance(item, tuple) for item in items):
            raise invalid('"truncation_direction": "Left" is for single texts, not [text, text_pair] pairs')
        if prompt:
            if any(isinstance(item, tuple) for item in items):
                raise invalid("`prompt_name` cannot be set with dual inputs")
            items = [prompt + item if isinstance(item, str) else item for item in items]
        ids = {i: item for i, item in enumerate(items) if isinstance(item, list)}
        if ids:
            texts = [item for item in items if not isinstance(item, list)]
            items_t, features_t, _ = self.tokenize(kind, texts, truncate, hint, left) if texts else ([], [], 0)
            return self._with_ids(items, ids, items_t, features_t, truncate, left, hint)
        items = self.bound(items, truncate, hint, left)
        pipe = self.pipelines[kind]
        try:
            features, cut = pipe.features(items)
        except BertforgeError as err:  # the tokenizer refused an input: TEI's Tokenizer error (422)
            raise ApiError(None, str(err), "Tokenizer") from None
        if cut and not truncate:
            raise self._too_long(items, features, hint)
        if cut and left:
            self._keep_the_end(items, features)
        return items, features, sum(len(f.input_ids) for f in features)

    def _with_ids(self, items: list[Any], ids: dict[int, list[int]], texts: list[Any], features: list[Any],
                  truncate: bool, left: bool, hint: str) -> tuple[list[Any], list[Any], int]:
        """The features of a request mixing token-id inputs (`ids`, by position) with texts (`texts` and their
        `features`, tokenized apart): one list in the request's order."""
        from ..pipelines.base import Feature

        vocab = self.tokenizer.vocab_size
        position = [i for i in range(len(items)) if i not in ids]  # the texts' positions in the request
        out = [Feature(item=position[f.item], input_ids=f.input_ids, token_type_ids=f.token_type_ids, extra=f.extra)
               for f in features]
        merged = list(items)
        for i, texts_i in enumerate(position):
            merged[texts_i] = texts[i]
        for i, row in ids.items():
            bad = next((t for t in row if not 0 <= t < vocab), None)
            if bad is not None:
                raise invalid(f"input {i}: token id {bad} is not in this model's vocabulary (0..{vocab - 1})")
            if len(row) > self.max_length:
                if not truncate:
                    raise invalid(f"`inputs` must have less than {self.max_length} tokens. Given: {len(row)} "
                                  f"(input {i}); {hint}")
                row = row[-self.max_length:] if left else row[:self.max_length]
            out.append(Feature(item=i, input_ids=list(row)))
        out.sort(key=lambda f: f.item)
        return merged, out, sum(len(f.input_ids) for f in out)

    def _keep_the_end(self, items: list[Any], features: list[Any]) -> None:
        """Features cut to max_length get the last tokens of their text instead of the first (TEI's
        "truncation_direction": "Left"), between the template's special tokens."""
        long = [f for f in features if len(f.input_ids) >= self.max_length]
        enc = self.tokenizer([items[f.item] for f in long], return_special_tokens_mask=True)
        for feature, ids, special in zip(long, enc["input_ids"], enc["special_tokens_mask"]):
            if len(ids) <= self.max_length:
                continue
            head = next(i for i, s in enumerate(special) if not s)  # the template's leading special tokens
            tail = next(i for i, s in enumerate(reversed(special)) if not s)  # ... and trailing ones
            keep = self.max_length - head - tail
            feature.input_ids = ids[:head] + ids[len(ids) - tail - keep:]

    def bound(self, items: list[Any], truncate: bool, hint: str, left: bool = False) -> list[Any]:
        """`items` with every text past `max_chars` characters cut to it (`truncate`; its last characters with
        `left`), or the 413 for the first. The cut keeps what the model reads unless the kept text averages more
        than `CHARS_PER_TOKEN` characters per token."""
        limit, bounded = self.max_chars, items
        for i, item in enumerate(items):
            parts = item if isinstance(item, tuple) else (item,)
            longest = max(len(text) for text in parts)
            if longest <= limit:
                continue
            if not truncate:
                raise invalid(f"`inputs` must have less than {limit} characters. Given: {longest} (input {i}; "
                              f"--max-input-chars, for the {self.max_length} tokens this model takes); {hint}")
            if bounded is items:
                bounded = list(items)
            bounded[i] = tuple(text[:limit] for text in parts) if isinstance(item, tuple) else (
                item[-limit:] if left else item[:limit])
        return bounded

    def _too_long(self, items: list[Any], features: list[Any], hint: str) -> ApiError:
        """The 413 for the first input that was cut to max_length (its length counted again, untruncated: at most
        `max_chars` characters)."""
        for feature in sorted(features, key=lambda f: f.item):
            if len(feature.input_ids) < self.max_length:
                continue
            item = items[feature.item]
            text, pair = item if isinstance(item, tuple) else (item, None)
            n = len(self.tokenizer([text], [pair] if pair is not None else None)["input_ids"][0])
            if n > self.max_length:
                return invalid(f"`inputs` must have less than {self.max_length} tokens. Given: {n} (input "
                               f"{feature.item}); {hint}")
        return invalid(f"`inputs` must have less than {self.max_length} tokens (an input is longer); {hint}")
