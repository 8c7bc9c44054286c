"""The settings of a fine-tuning run (`FinetuneConfig`) and of reading a task's data (`DataOptions`).

A run's `FinetuneConfig` is saved as `OUT/finetune_config.json`; `FinetuneConfig.from_json` reads it back, so
`bertforge finetune --config OUT/finetune_config.json --out OUT2` repeats the run.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BertforgeError

FINETUNE_TASKS = ("classification", "ner", "qa")  # `--task` of finetune / evaluate / predict
TASKS = FINETUNE_TASKS  # the old name (not `bertforge.pipelines.PIPELINE_CLASSES`), kept importable


@dataclass(kw_only=True)
class DataOptions:
    """How to read and encode a task's files; shared by finetune, evaluate and predict."""

    max_length: int | None = None  # tokens per input; None: 128 (384 for qa), at most the model's positions
    text_column: str | None = None  # classification: None picks "text", "sentence" or "sentence1"
    text_pair_column: str | None = None  # classification: the second text of a pair
    label_column: str = "label"
    no_header: bool = False  # CSV/TSV without a header row: columns are 0-based indices
    doc_stride: int = 128  # qa: tokens shared by consecutive windows of a long context
    max_query_length: int = 64  # qa: longer questions are cut to this many tokens
    max_answer_length: int = 30  # qa: the longest answer span, in tokens
    n_best: int = 20  # qa: start and end candidates per window
    eval_batch_size: int = 64
    device: str | None = None  # None: "cuda" when available, else "cpu"
    progress: bool | None = None  # tqdm bars; None shows them on a terminal only

    def validate(self) -> None:
        """Raise `BertforgeError` naming the first bad setting."""
        for name in ("doc_stride", "max_query_length", "max_answer_length", "n_best", "eval_batch_size"):
            _check_int(name, getattr(self, name), 1)
        if self.max_length is not None:
            _check_int("max_length", self.max_length, 8)


@dataclass(kw_only=True)
class FinetuneConfig(DataOptions):
    """Everything that defines a fine-tuning run. Paths are made absolute when the run starts."""

    task: str  # "classification", "ner" or "qa"
    model: str  # directory of the pretrained model and its tokenizer
    train: str
    dev: str
    out: str
    epochs: int = 3
    batch_size: int = 32
    lr: float = 5e-5
    warmup_ratio: float = 0.1  # fraction of the optimizer steps with a linearly rising learning rate
    weight_decay: float = 0.01  # AdamW decay, not applied to biases and LayerNorm weights
    seed: int = 42
    grad_accum: int = 1  # batches whose gradients add up to one optimizer step
    eval_every: int | None = None  # also evaluate every N optimizer steps (always at each epoch's end)
    early_stop: int | None = None  # stop after N evaluations without a better main metric
    metric: str | None = None  # the main metric; None: accuracy / pearson / f1 by task
    group_by_length: bool = True  # batch training examples of similar length together (less padding)
    log_every: int = 10  # write the training loss to metrics.jsonl every N optimizer steps
    overwrite: bool = False  # replace an --out that already holds a run
    max_skipped_steps: int = 10  # stop with an error after this many non-finite steps in a row

    def validate(self) -> None:
        super().validate()
        if self.task not in FINETUNE_TASKS:
            raise BertforgeError(f"unknown task {self.task!r}; choose one of: {', '.join(FINETUNE_TASKS)}")
        for name in ("model", "train", "dev", "out"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise BertforgeError(f"finetune needs {name!r} (a path)")
        for name in ("epochs", "batch_size", "grad_accum", "log_every", "max_skipped_steps"):
            _check_int(name, getattr(self, name), 1)
        for name in ("eval_every", "early_stop"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        _check_int("seed", self.seed, 0)
        if not isinstance(self.lr, (int, float)) or not 0 < self.lr < 1:
            raise BertforgeError(f"lr must be a number in (0, 1), got {self.lr!r}")
        if not isinstance(self.warmup_ratio, (int, float)) or not 0 <= self.warmup_ratio < 1:
            raise BertforgeError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            raise BertforgeError(f"weight_decay must be >= 0, got {self.weight_decay!r}")

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
        """Read a saved `finetune_config.json` (its "versions" entry is information only)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except OSError as err:
            raise BertforgeError(f"{path}: cannot read ({err.strerror})") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise BertforgeError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise BertforgeError(f"{path}: expected a JSON object")
        return cls.from_dict(data, str(path))


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BertforgeError(f"{name} must be an integer >= {minimum}, got {value!r}")
