"""The settings of a sentence-embedding training run (`EmbeddingsConfig`), each field also its command-line option.
A run's settings are saved as `OUT/train_embeddings_config.json`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core.constants import SEED
from ..core.errors import BertforgeError
from ..core.system import TRAINING_DEVICES
from ..finetune.config import FinetuneConfig, check_checkpointing, check_int, check_optimization
from ..core.options import check_choices, option, same_option
from ..training.adapters import LoraOptions
from ..training.step import PRECISION_HELP, PRECISIONS, check_precision
from ..model.pooling import POOLINGS

LOSSES = ("auto", "mnrl", "cosent", "cosine", "margin-mse")
SPARSE = ("splade",)


@dataclass(kw_only=True, frozen=True)
class EmbeddingsConfig(LoraOptions):
    """Everything that defines a `train-embeddings` run. Paths are made absolute when the run starts."""

    model: str = option(help="starting model directory (a BERT checkpoint or a sentence-transformers model)",
                        metavar="DIR")
    train: str = option(help="training pairs, triplets or scored pairs (TSV/CSV/JSONL/Parquet/Arrow)", metavar="FILE")
    dev: str | None = option(None, "held-out pairs or triplets (retrieval: NDCG@10, MRR@10, MAP@100, recall@k, "
                             "precision@k), a BEIR folder (retrieval) or scored pairs (Spearman, Pearson), scored "
                             "before training and at each evaluation", metavar="FILE")
    out: str = option(help="output: a sentence-transformers model directory, with the run's logs", metavar="DIR")
    sparse: str | None = option(None, "splade: train a sparse encoder (SPLADE: log(1 + relu(MLM logits)) max-pooled "
                                "over the tokens; the model needs an MLM head) and write a sentence-transformers "
                                "SparseEncoder; default: dense, or splade when --model is a SparseEncoder",
                                choices=SPARSE)
    loss: str = option("auto", "mnrl (in-batch negatives; pairs, triplets), cosent or cosine (cosine-similarity "
                       "MSE; scored pairs), margin-mse (distillation: query, positive, negative and the teacher's "
                       "score margin, score(query, positive) - score(query, negative)); auto: mnrl for pairs and "
                       "triplets, cosent for scored pairs, margin-mse for scored triplets", choices=LOSSES)
    symmetric: bool = option(False, "mnrl: also rank the anchors for each positive (the symmetric loss)")
    scale: float | None = option(None, "mnrl and cosent: the factor on similarities (1 / temperature); default 20 "
                                 "(on cosines), 1 for --sparse's mnrl (on dot products)", metavar="S")
    query_regularizer: float = option(5e-5, "--sparse: the weight of the FLOPS regularizer of the queries (anchors), "
                                      "warmed up quadratically over the first third of the steps", metavar="W")
    document_regularizer: float = option(3e-5, "--sparse: the weight of the FLOPS regularizer of the documents "
                                         "(positives, negatives), warmed up as --query-regularizer", metavar="W")
    prompts: list[str] | None = option(None, "text put before the texts of a column, as NAME=TEXT: NAME a column of "
                                       "--train, or query (the first column) or document (the others); saved as "
                                       "the model's sentence-transformers prompts, which embed, serve and evaluate "
                                       "apply (evaluate and --dev: query to the queries, document to the corpus), "
                                       "e.g. query='query: ' document='passage: '", metavar="NAME=TEXT")
    matryoshka_dims: str | None = option(None, "Matryoshka: the loss summed over these prefix sizes of the embedding "
                                         "(truncated, re-normalised); list the full size too to keep training it, "
                                         "e.g. 384,256,128,64", metavar="D,D,...")
    score_max: float | None = option(None, "scored pairs: the top of the score scale, scores become score / MAX; "
                                     "default: scores within [-1, 1] are used as they are, scores within [0, 5] "
                                     "(STS) are divided by 5, others are refused", metavar="MAX")
    pooling: str | None = option(None, "mean or cls (default: what a sentence-transformers model declares, else "
                                 "mean)", choices=POOLINGS)
    normalize: bool = option(True, "save without a Normalize module (raw pooled vectors at inference)",
                             flag="--no-normalize")
    max_length: int | None = option(None, "tokens per text (default: a sentence-transformers model's max_seq_length, "
                                    "else 128; at most the model's positions)", metavar="N")
    epochs: int = option(1, "passes over the training data", metavar="N")
    batch_size: int = option(64, "examples per optimizer step (the in-batch negatives of mnrl)", metavar="N")
    mini_batch_size: int | None = option(None, "gradient caching: run the model on this many texts at a time, so a "
                                         "large --batch-size fits in memory with the same gradient", metavar="N")
    lr: float = option(2e-5, "peak learning rate", metavar="LR")
    warmup_ratio: float = option(0.1, "fraction of the optimizer steps with a linearly rising learning rate",
                                 metavar="R")
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and LayerNorm weights)", metavar="W")
    seed: int = option(SEED, "random seed", metavar="N")
    eval_every: int | None = option(None, "also evaluate every N optimizer steps (always at each epoch's end)",
                                    metavar="N")
    early_stop_patience: int | None = option(None, "stop after N evaluations without a better main metric", metavar="N")
    eval_batch_size: int = option(64, "texts per batch when embedding the dev set", metavar="N")
    log_every: int = option(10, "write the training loss to metrics.jsonl every N optimizer steps", metavar="N")
    overwrite: bool = option(False, "replace an --out that already holds a train-embeddings run (kept aside until the "
                             "new run's first checkpoint)")
    save_every: int = same_option(FinetuneConfig, "save_every")
    keep_checkpoints: int = same_option(FinetuneConfig, "keep_checkpoints")
    resume: bool = same_option(FinetuneConfig, "resume")
    max_skipped_steps: int = option(10, "stop with an error after N optimizer steps in a row with a non-finite loss "
                                    "or gradient", metavar="N")
    device: str | None = option(None, TRAINING_DEVICES, metavar="DEVICE")
    precision: str = option("auto", PRECISION_HELP, choices=PRECISIONS)
    progress: bool | None = option(None, "no progress bars (default: bars on a terminal only)", flag="--no-progress")

    grad_accum: ClassVar[int] = 1  # one batch a step: a large batch is what --mini-batch-size is for
    freeze_backbone: ClassVar[bool] = False  # fine-tuning's controls, not offered here: the encoder is what trains
    layer_lr_decay: ClassVar[float] = 1.0
    compile: ClassVar[bool] = False  # the model is called through the pooling helpers, not its forward: nothing to compile

    def dims(self) -> list[int]:
        """The Matryoshka dimensions, largest first; [] without them."""
        if self.matryoshka_dims is None:
            return []
        try:
            dims = [int(d) for d in str(self.matryoshka_dims).split(",") if d.strip()]
        except ValueError:
            raise BertforgeError(f"--matryoshka-dims must be integers separated by commas, got {self.matryoshka_dims!r}") from None
        if not dims or any(d < 1 for d in dims) or len(set(dims)) != len(dims):
            raise BertforgeError(f"--matryoshka-dims must be distinct positive integers, got {self.matryoshka_dims!r}")
        return sorted(dims, reverse=True)

    def scale_value(self, loss: str) -> float:
        """--scale, else its default for `loss`: 20 on cosines, 1 on the dot products of a sparse encoder's mnrl
        (sentence-transformers' defaults, `SparseMultipleNegativesRankingLoss`'s the latter)."""
        return self.scale if self.scale is not None else (1.0 if self.sparse and loss == "mnrl" else 20.0)

    def prompt_map(self) -> dict[str, str]:
        """--prompts as {name: text} (the Python API also takes a dict); {} without them."""
        if self.prompts is None:
            return {}
        if isinstance(self.prompts, dict):
            items = list(self.prompts.items())
        elif isinstance(self.prompts, (list, tuple)) and all(isinstance(p, str) for p in self.prompts):
            items = []
            for given in self.prompts:
                name, sep, text = given.partition("=")
                if not sep or not name.strip():
                    raise BertforgeError(f"--prompts takes NAME=TEXT (e.g. query='query: '), got {given!r}")
                items.append((name.strip(), text))
        else:
            raise BertforgeError(f"prompts must be NAME=TEXT strings or a dict of names to texts, got {self.prompts!r}")
        prompts: dict[str, str] = {}
        for name, text in items:
            if not isinstance(name, str) or not isinstance(text, str):
                raise BertforgeError(f"prompts must map names to texts, got {name!r}: {text!r}")
            if name in prompts:
                raise BertforgeError(f"--prompts names {name!r} twice")
            prompts[name] = text
        return prompts

    def validate(self) -> None:
        """Raise `BertforgeError` naming the first bad setting."""
        check_choices(self)
        for name in ("model", "train", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise BertforgeError(f"train-embeddings needs {name!r} (a path)")
        for name in ("epochs", "batch_size", "eval_batch_size", "log_every", "max_skipped_steps"):
            check_int(name, getattr(self, name), 1)
        for name in ("eval_every", "early_stop_patience", "mini_batch_size"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if self.max_length is not None:
            check_int("max_length", self.max_length, 3)
        check_int("seed", self.seed, 0)
        check_checkpointing(self)
        check_optimization(self)
        check_precision(self.precision)
        if self.scale is not None and (not isinstance(self.scale, (int, float)) or not self.scale > 0):
            raise BertforgeError(f"scale must be a positive number, got {self.scale!r}")
        for name in ("query_regularizer", "document_regularizer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise BertforgeError(f"{name} must be a number >= 0, got {value!r}")
        self.prompt_map()
        if self.score_max is not None and (not isinstance(self.score_max, (int, float)) or not self.score_max > 0):
            raise BertforgeError(f"score_max must be a positive number, got {self.score_max!r}")
        self.dims()
        self.lora()

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
