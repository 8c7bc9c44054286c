"""The settings of a fine-tuning run (`FinetuneConfig`) and of reading a task's data (`DataOptions`).

A run's `FinetuneConfig` is saved as `OUT/finetune_config.json`; `FinetuneConfig.from_json` reads it back, so
`bertforge finetune --run-config OUT/finetune_config.json --out OUT2` repeats the run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.constants import SEED
from ..core.errors import BertforgeError
from ..core.system import TRAINING_DEVICES
from ..training.optim import check_layer_lr_decay
from ..core.options import check_choices, option
from ..training.adapters import LoraOptions
from ..training.step import PRECISION_HELP, PRECISIONS, check_precision
from .rerank_losses import RERANK_LOSSES

FINETUNE_TASKS = ("classification", "ner", "qa", "rerank", "multiple-choice")  # `--task` of finetune / evaluate / predict
DEFAULT_LABEL_COLUMN = "label"  # --label-column left at it: each task's own default (ner: ner_tags/tags, qa: answers)


@dataclass(kw_only=True, frozen=True)
class DataOptions:
    """How to read and encode a task's files; shared by finetune, evaluate and predict (each field is also their
    command-line option, see `bertforge.core.options`)."""

    max_length: int | None = option(None, "tokens per input (default 128; 384 for qa; at most the model's positions)",
                                    metavar="N")
    text_column: str | None = option(None, "classification: text column or JSON key; a 0-based index with "
                                     "--no-header (default: text, sentence or sentence1); ner rows: the words' "
                                     "column (default: tokens, words); qa rows: the question's (default: question); "
                                     "multiple-choice: the context's (default: sent1, context or question)",
                                     metavar="NAME")
    text_pair_column: str | None = option(None, "classification: second text of a sentence pair; qa rows: the "
                                          "context's column (default: context); multiple-choice: a text put before "
                                          "every choice (default: sent2, SWAG's, where there is one)", metavar="NAME")
    label_column: str = option(DEFAULT_LABEL_COLUMN, "classification: label column; ner rows: the tags' column (left "
                               "at 'label': ner_tags, tags or label); qa rows: the answers' (left at 'label': answers); "
                               "multiple-choice: the right choice's index, from 0",
                               metavar="NAME")
    label_separator: str | None = option(None, "classification: split each text label on SEP into several labels "
                                         "(multi-label, e.g. '|'; an empty label: none); a list label (JSONL, "
                                         "Parquet) needs none", metavar="SEP")
    choice_columns: list[str] | None = option(None, "multiple-choice: the choices' columns, in order, or one column "
                                              "holding a list of choices (default: SWAG's ending0, ending1, ...; "
                                              "else choices)", metavar="NAME")
    no_header: bool = option(False, "CSV/TSV without a header row; columns are then 0-based indices")
    lenient_rows: bool = option(False, "CSV/TSV: skip rows with more or fewer fields than the header, or broken "
                                "quotes, with a warning counting them (default: such a row is an error naming its line)")
    doc_stride: int = option(128, "qa: tokens shared by consecutive context windows", metavar="N")
    max_query_length: int = option(64, "qa: longest question in tokens", metavar="N")
    max_answer_length: int = option(30, "qa: longest answer in tokens", metavar="N")
    n_best: int = option(20, "qa: start/end candidates per window", metavar="N")
    eval_batch_size: int = option(64, "batch size for evaluation/prediction", metavar="N")
    device: str | None = option(None, TRAINING_DEVICES, metavar="DEVICE")
    precision: str = option("auto", PRECISION_HELP + ". Evaluation and prediction: auto is fp32 on a CPU, bf16 runs "
                            "the encoder under bf16 autocast", choices=PRECISIONS)
    progress: bool | None = option(None, "no progress bars (default: bars on a terminal only)", flag="--no-progress")

    def validate(self) -> None:
        """Raise `BertforgeError` naming the first bad setting."""
        check_choices(self)
        check_precision(self.precision)
        for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best", "eval_batch_size"):
            check_int(name, getattr(self, name), 1)
        if self.max_length is not None:
            check_int("max_length", self.max_length, 8)
        if self.choice_columns is not None and (
                not isinstance(self.choice_columns, (list, tuple)) or not self.choice_columns
                or not all(isinstance(c, str) and c for c in self.choice_columns)
                or len(set(self.choice_columns)) != len(self.choice_columns)):
            raise BertforgeError(f"choice_columns must be distinct column names, got {self.choice_columns!r}")
        if self.label_separator is not None and (not isinstance(self.label_separator, str) or not self.label_separator):
            raise BertforgeError(f"label_separator must be a non-empty string, got {self.label_separator!r}")


@dataclass(kw_only=True, frozen=True)
class FinetuneConfig(LoraOptions, DataOptions):
    """Everything that defines a fine-tuning run. Paths are made absolute when the run starts."""

    task: str = option(help="the task: classification, ner, qa, rerank (a cross-encoder reranker) or "
                       "multiple-choice (SWAG-style)",
                       choices=FINETUNE_TASKS)
    model: str = option(help="model directory (weights, config.json, tokenizer)", metavar="DIR")
    train: str = option(help="training data (CSV/TSV/JSONL/Parquet/Arrow, CoNLL, or SQuAD JSON)", metavar="FILE")
    dev: str = option(help="dev data, scored at each evaluation", metavar="FILE")
    out: str = option(help="output directory: model/, eval.json, metrics.jsonl, ...", metavar="DIR")
    epochs: int = option(3, "passes over the training data", metavar="N")
    batch_size: int = option(32, "examples per batch (under torchrun, the global batch: each process takes its share)",
                            metavar="N")
    lr: float = option(5e-5, "peak learning rate", metavar="LR")
    warmup_ratio: float = option(0.1, "fraction of the optimizer steps with a linearly rising learning rate",
                                 metavar="R")
    weight_decay: float = option(0.01, "AdamW weight decay (not on biases and LayerNorm weights)", metavar="W")
    freeze_backbone: bool = option(False, "train only the task head (the pooler included): the embeddings and "
                                   "encoder keep their pre-trained weights and run without dropout")
    layer_lr_decay: float = option(1.0, "layer-wise learning-rate decay F in (0, 1]: the head and pooler at --lr, "
                                   "the top layer at lr*F, the next at lr*F^2, ..., the embeddings at lr*F^(L+1); "
                                   "ALBERT's shared layer at its top block's rate; 1 = off", metavar="F")
    seed: int = option(SEED, "random seed", metavar="N")
    grad_accum: int = option(1, "batches whose gradients add up to one optimizer step", metavar="N")
    eval_every: int | None = option(None, "also evaluate every N optimizer steps (always at each epoch's end)",
                                    metavar="N")
    early_stop_patience: int | None = option(None, "stop after N evaluations without a better main metric", metavar="N")
    metric: str | None = option(None, "main metric that picks the best checkpoint (default: accuracy; pearson for "
                                "regression; micro_f1 for multi-label; f1 for ner and qa; ndcg@10 for rerank)")
    loss: str | None = option(None, "rerank: the loss, as sentence-transformers' CrossEncoder losses: bce (default; "
                              "pointwise, labels in [0, 1]), mse (a teacher's scores), listnet or lambdaloss (each "
                              "row's documents ranked together), mnrl (a positive against in-batch and hard "
                              "negatives)", choices=tuple(RERANK_LOSSES))
    group_by_length: bool = option(False, "batches of examples of similar length instead of plain shuffled ones "
                                   "(less attention padding, but worse scores: see docs/guides/finetuning.md)")
    log_every: int = option(10, "write the training loss to metrics.jsonl every N optimizer steps", metavar="N")
    overwrite: bool = option(False, "replace an --out that already holds a run")
    max_skipped_steps: int = option(10, "stop with an error after N optimizer steps in a row with a non-finite loss "
                                    "or gradient", metavar="N")
    compile: bool = option(False, "torch.compile the model for training (evaluation runs it as it is)")
    save_every: int = option(0, "also checkpoint every N optimizer steps into OUT/checkpoints (a checkpoint is always "
                             "written at each epoch's end, and where early stopping ends the run); 0: at those only",
                             metavar="N")
    keep_checkpoints: int = option(1, "complete checkpoints kept in OUT/checkpoints, the newest", metavar="K")
    resume: bool = option(False, "continue the run in --out from its newest complete checkpoint, exactly as if it had "
                          "never stopped; settings that change the run must be the run's own")

    def validate(self) -> None:
        check_choices(self)
        super().validate()
        if not isinstance(self.compile, bool):
            raise BertforgeError(f"compile must be true or false, got {self.compile!r}")
        for name in ("model", "train", "dev", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise BertforgeError(f"finetune needs {name!r} (a path)")
        for name in ("epochs", "batch_size", "grad_accum", "log_every", "max_skipped_steps"):
            check_int(name, getattr(self, name), 1)
        check_checkpointing(self)
        for name in ("eval_every", "early_stop_patience"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        check_int("seed", self.seed, 0)
        check_optimization(self)
        check_layer_lr_decay(self.layer_lr_decay)
        if not isinstance(self.freeze_backbone, bool):
            raise BertforgeError(f"freeze_backbone must be true or false, got {self.freeze_backbone!r}")
        if self.loss is not None and self.task != "rerank":
            raise BertforgeError(f"--loss chooses a reranker's loss (--task rerank), not {self.task}'s")
        if self.lora() is not None and self.freeze_backbone:
            raise BertforgeError("lora_rank and freeze_backbone both say what trains: choose one")

    def data_options(self) -> DataOptions:
        """The reading and encoding settings alone."""
        names = {f.name for f in dataclasses.fields(DataOptions)}
        return DataOptions(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> FinetuneConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"versions"})
        if unknown:
            raise BertforgeError(f"{source}: unknown setting(s) {', '.join(unknown)}")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as err:  # a required setting is missing
            raise BertforgeError(f"{source}: {err}") from None

    @classmethod
    def from_json(cls, path: str | Path) -> FinetuneConfig:
        """A run's settings from its `finetune_config.json` (or the run's directory), to repeat the run: what
        `--run-config` reads (`training.run_dir.recorded_settings`: --resume, --overwrite and the versions left out)."""
        from ..training.run_dir import recorded_settings
        from .api import FINETUNING

        return cls.from_dict(recorded_settings(path, FINETUNING), str(path))


def check_checkpointing(settings: Any) -> None:
    """The checkpoint settings every fine-tuning-style trainer shares: save_every, keep_checkpoints, resume (not
    with overwrite)."""
    check_int("keep_checkpoints", settings.keep_checkpoints, 1)
    check_int("save_every", settings.save_every, 0)
    if settings.resume and settings.overwrite:
        raise BertforgeError("--resume and --overwrite contradict each other; choose one")


def check_optimization(settings: Any) -> None:
    """The optimizer settings every fine-tuning-style trainer shares: lr, warmup_ratio, weight_decay."""
    if not isinstance(settings.lr, (int, float)) or not 0 < settings.lr < 1:
        raise BertforgeError(f"lr must be a number in (0, 1), got {settings.lr!r}")
    if not isinstance(settings.warmup_ratio, (int, float)) or not 0 <= settings.warmup_ratio < 1:
        raise BertforgeError(f"warmup_ratio must be in [0, 1), got {settings.warmup_ratio!r}")
    if not isinstance(settings.weight_decay, (int, float)) or settings.weight_decay < 0:
        raise BertforgeError(f"weight_decay must be >= 0, got {settings.weight_decay!r}")


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BertforgeError(f"{name} must be an integer >= {minimum}, got {value!r}")
