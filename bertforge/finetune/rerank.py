"""Rerankers: `finetune --task rerank` trains a cross-encoder — a one-logit sequence head over [CLS] query [SEP]
document [SEP] — from any family's checkpoint, with the losses of sentence-transformers' `CrossEncoder`.

Training rows, one query each (columns found by name; `--text-column` / `--text-pair-column` / `--label-column`
rename the query, document and label columns):

* pointwise: query, document, label (a number in [0, 1]: 1 relevant, 0 not, or a teacher's score);
* listwise: query, documents (a list), labels (a list of numbers, one per document) — JSONL, Parquet or rows in
  memory;
* n-tuples: query (or anchor), positive, negative or negative_1 ... negative_N — what `mine-negatives` writes —
  and positives / negatives (a text or a list each, maybe empty): labels 1 and 0. Three columns of other names
  are (query, positives, negatives) by position.

The losses (`--loss`, `RERANK_LOSSES`), as sentence-transformers defines them with its default settings:

* `bce` (the default): binary cross-entropy of each pair's logit against its label (`BinaryCrossEntropyLoss`);
* `mse`: squared error of the logit against the label (`MSELoss`, for a teacher's scores);
* `listnet`: cross-entropy between the softmax of a row's labels and of its logits (`ListNetLoss`);
* `lambdaloss`: LambdaLoss with the NDCG-Loss2++ weighting (μ 10, σ 1, all ranks, `LambdaLoss`);
* `mnrl`: each query's positive against its hard negatives and 4 documents drawn from the batch's other rows, the
  logits through a sigmoid times 10 into a cross-entropy (`MultipleNegativesRankingLoss`); rows must be (query,
  positive, negatives...).

Pointwise losses batch pairs (`--batch-size` pairs), the others rows (`--batch-size` queries). The dev file (any
of these layouts) is scored per query — rows of the same query gathered — as `evaluate --task rerank` scores:
`ndcg@10` (the main metric, as sentence-transformers' `CrossEncoderRerankingEvaluator`), `mrr@10` and `map`,
a document relevant when its label is at least 0.5. The model is written with sentence-transformers' CrossEncoder
settings (a sigmoid over the logit), so `CrossEncoder(DIR)`, `pipeline("rerank")` and `serve`'s `/rerank` give its
scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import BertforgeError
from ..data.tables import InMemory
from ..evaluation.metrics import rerank_metrics
from ..model import BertForSequenceClassification
from ..model.config import BertConfig
from ..model.pooling import write_cross_encoder_files
from .config import DEFAULT_LABEL_COLUMN, DataOptions
from .data import TextExample, read_text_file, record_source, table_rows
from .rerank_losses import DEFAULT_RERANK_LOSS, MNRL_NEGATIVES, RERANK_LOSSES
from .features import collate, encode_classification, training_batches
from .tasks import TASK_CLASSES, Encoded, Output, Task
from .trainer import Finetuning, move, rank_share

QUERY_COLUMNS = ("query", "anchor", "question")
DOCUMENT_COLUMNS = ("document", "passage", "response", "answer", "text")
RELEVANT_AT = 0.5  # a dev document is relevant when its label is at least this
# sentence-transformers' CrossEncoder settings: its score is the sigmoid of the one logit
CROSS_ENCODER_ACTIVATION = "torch.nn.modules.activation.Sigmoid"


@dataclass
class RerankRow:
    """One training row: a query, its documents and their labels (None when predicting from unlabelled rows)."""

    line: int
    query: str
    documents: list[str]
    labels: list[float] | None


# ---------------------------------------------------------------------------------------------------- reading


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise BertforgeError(f"{where}: expected a non-empty text, got {value!r:.60}")
    return value


def _texts(value: Any, where: str, empty: bool = False) -> list[str]:
    """A list of texts, or one text; with `empty`, nothing (None, "", []) is no texts."""
    if empty and (value is None or value == "" or (isinstance(value, (list, tuple)) and not value)):
        return []
    if isinstance(value, str):
        return [_text(value, where)]
    if not isinstance(value, (list, tuple)) or not value:
        raise BertforgeError(f"{where}: expected a list of texts, got {value!r:.60}")
    return [_text(v, where) for v in value]


def _label(value: Any, where: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise BertforgeError(f"{where}: a reranker's label is a number in [0, 1] (1 relevant, 0 not), got {value!r:.60}")
    return number


def _pick(record: dict[str, Any], given: str | None, defaults: Sequence[str]) -> str | None:
    if given is not None:
        return given if given in record else None
    return next((name for name in defaults if name in record), None)


def _row(path: Path, line: int, record: dict[str, Any], opts: DataOptions, labelled: bool) -> RerankRow:
    """A row of any of the module docstring's layouts, by its column names."""
    where = f"{path}:{line}"
    layouts = ("documents", "positives", "positive", *DOCUMENT_COLUMNS, opts.text_pair_column)
    if len(record) == 3 and opts.text_column is None and not any(c in record for c in layouts):
        record = dict(zip(("query", "positives", "negatives"), record.values()))  # by position, any names
    query_column = _pick(record, opts.text_column, QUERY_COLUMNS)
    if query_column is None:
        wanted = repr(opts.text_column) if opts.text_column else "query, anchor or question"
        raise BertforgeError(f"{where}: no query column ({wanted}; the row has {', '.join(map(str, record))})")
    query = _text(record[query_column], f"{where}: {query_column}")
    if "documents" in record:  # listwise
        documents = _texts(record["documents"], f"{where}: documents")
        labels = None
        if labelled or record.get("labels") is not None:
            raw = record.get("labels")
            if not isinstance(raw, (list, tuple)) or len(raw) != len(documents):
                raise BertforgeError(f"{where}: 'labels' must be a list of one number per document "
                                     f"({len(documents)}), got {raw!r:.60}")
            labels = [_label(v, f"{where}: labels") for v in raw]
        return RerankRow(line, query, documents, labels)
    positive = next((c for c in ("positives", "positive") if c in record), None)
    if positive is not None:  # n-tuples, or positives / negatives lists
        positives = _texts(record[positive], f"{where}: {positive}", empty=True)
        negative_columns = [c for c in record if c in ("negatives", "negative")
                            or (c.startswith("negative_") and c[9:].isdigit())]
        negatives = [t for c in negative_columns for t in _texts(record[c], f"{where}: {c}", empty=True)]
        if not positives and not negatives:
            raise BertforgeError(f"{where}: the row has no document (its positives and negatives are empty)")
        return RerankRow(line, query, positives + negatives, [1.0] * len(positives) + [0.0] * len(negatives))
    document_column = _pick(record, opts.text_pair_column, DOCUMENT_COLUMNS)
    if document_column is None:
        raise BertforgeError(f"{where}: no document column (a document/passage column and a label, documents and "
                             "labels lists, or positive and negative columns)")
    document = _text(record[document_column], f"{where}: {document_column}")
    label_column = opts.label_column if opts.label_column != DEFAULT_LABEL_COLUMN else (
        "label" if "label" in record else "score")
    if label_column not in record or record[label_column] in (None, ""):
        if labelled:
            raise BertforgeError(f"{where}: no label (column {label_column!r})")
        return RerankRow(line, query, [document], None)
    return RerankRow(line, query, [document], [_label(record[label_column], f"{where}: {label_column}")])


def read_rerank_rows(data: str | Path | InMemory, opts: DataOptions, labelled: bool) -> list[RerankRow]:
    """The rows of a CSV/TSV/JSONL/Parquet/Arrow file or of rows in memory (see the module docstring)."""
    source = record_source(data)
    if source is not None:
        path, records = source
    else:
        path = Path(data)  # type: ignore[arg-type]
        header, cells = table_rows(path, read_text_file(path), opts.no_header, opts.lenient_rows)
        names = header if header is not None else [str(i) for i in range(len(cells[0][1]))]
        records = [(line, dict(zip(names, row))) for line, row in cells]
    rows = [_row(path, line, record, opts, labelled) for line, record in records]
    if not rows:
        raise BertforgeError(f"{path}: no rows")
    return rows


def by_query(rows: Sequence[RerankRow]) -> list[list[tuple[int, int]]]:
    """Each query's (row, document) positions, rows of the same query gathered and each of its documents once (its
    first row's), in the order of first sight."""
    gathered: dict[str, dict[str, tuple[int, int]]] = {}
    for r, row in enumerate(rows):
        documents = gathered.setdefault(row.query, {})
        for d, document in enumerate(row.documents):
            documents.setdefault(document, (r, d))
    return [list(documents.values()) for documents in gathered.values()]


# ---------------------------------------------------------------------------------------------------- the task


def _sigmoid(values: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-values.astype(np.float64)))


class Rerank(Task):
    """A cross-encoder reranker (see the module docstring)."""

    name = "rerank"
    model_class = BertForSequenceClassification
    default_max_length = 512
    metric_names = ("ndcg@10", "mrr@10", "map")

    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[RerankRow], bool]:
        return read_rerank_rows(path, opts, labelled), False

    def label_overrides(self, examples: list[RerankRow], path: Path) -> dict[str, Any]:
        return {"num_labels": 1, "problem_type": None, "id2label": {0: "LABEL_0"}, "label2id": {"LABEL_0": 0},
                "sentence_transformers": {"activation_fn": CROSS_ENCODER_ACTIVATION}}

    def encode(self, tokenizer: Any, examples: list[RerankRow], opts: DataOptions, config: BertConfig, path: Path,
               labelled: bool) -> Encoded:
        """One feature per (query, document) pair, row after row (no targets: the rows keep the labels)."""
        pairs = [TextExample(text=row.query, text_pair=document, label=None, line=row.line)
                 for row in examples for document in row.documents]
        return Encoded(path, examples, encode_classification(tokenizer, pairs, self.max_length(opts, config), None))

    def check_trainable(self, data: Encoded) -> None:
        rows: list[RerankRow] = data.examples
        labels = [v for row in rows for v in row.labels or []]
        if len(set(labels)) < 2:
            raise BertforgeError(f"{data.path}: every document has the label {labels[0]!r}; a reranker learns from "
                                 "relevant and irrelevant documents (labels 1 and 0, or scores between)")

    def pair_scores(self, data: Encoded, outputs: list[Output]) -> list[list[float]]:
        """Each row's documents' scores (the sigmoid of the logit, sentence-transformers' CrossEncoder score)."""
        scores = iter(float(_sigmoid(o["logits"])[0]) for o in outputs)
        return [[next(scores) for _ in row.documents] for row in data.examples]

    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        scores = self.pair_scores(data, outputs)
        rows: list[RerankRow] = data.examples
        queries = by_query(rows)
        metrics = rerank_metrics([[scores[r][d] for r, d in q] for q in queries],
                                 [[(rows[r].labels or [0.0])[d] >= RELEVANT_AT for r, d in q] for q in queries])
        return {**metrics, "queries": len(queries)}

    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        """One record per row: its documents best first, as `pipeline("rerank")` answers."""
        records = []
        for row, scores in zip(data.examples, self.pair_scores(data, outputs)):
            order = sorted(range(len(scores)), key=lambda i: -scores[i])
            records.append({"line": row.line, "query": row.query, "ranking": [
                {"corpus_id": i, "score": scores[i], "text": row.documents[i]} for i in order]})
        return records

    def sequences_per_example(self, examples: list[RerankRow], cfg: Any) -> int:
        """The pairs one unit of `--batch-size` makes: a pair (bce, mse), a row's documents (listwise), or a row's
        positive, in-batch and hard negatives (mnrl)."""
        loss = RERANK_LOSSES[cfg.loss or DEFAULT_RERANK_LOSS]
        widest = max(len(row.documents) for row in examples)
        return {"pairs": 1, "rows": widest, "in-batch": widest + MNRL_NEGATIVES}[loss.batches]

    def save_files(self, directory: Path, versions: dict[str, str]) -> None:
        """sentence-transformers' CrossEncoder settings beside the checkpoint (its sigmoid score)."""
        write_cross_encoder_files(directory, CROSS_ENCODER_ACTIVATION, versions)

    def training(self, model: Any, data: Encoded, evaluate: Callable[[], dict[str, Any]], cfg: Any, main_metric: str,
                 tokenizer: Any, rt: Any) -> Finetuning:
        return RerankTraining(model, data, evaluate, cfg, main_metric, tokenizer, rt)


TASK_CLASSES[Rerank.name] = Rerank


# ---------------------------------------------------------------------------------------------------- training


def in_batch_candidates(rows: Sequence[RerankRow], generator: torch.Generator) -> list[list[str]]:
    """`mnrl`'s documents for each row of a batch: its positive, then MNRL_NEGATIVES documents of the other rows
    (any of their columns; drawn from `generator` without repeats, or all of them when there are no more), then its
    own hard negatives — the candidates sentence-transformers' MultipleNegativesRankingLoss scores."""
    count, width = len(rows), len(rows[0].documents)
    pool = [row.documents[c] for c in range(width) for row in rows]  # column after column
    others = ~torch.eye(count, dtype=torch.bool).repeat(1, width)  # [count, count * width]: not the row's own
    if MNRL_NEGATIVES < count * width - width:
        drawn = torch.multinomial(others.float(), MNRL_NEGATIVES, generator=generator)
    else:
        drawn = torch.arange(count * width).repeat(count, 1)[others].view(count, -1)
    return [[row.documents[0], *(pool[j] for j in drawn[i].tolist()), *row.documents[1:]]
            for i, row in enumerate(rows)]


@dataclass
class RerankBatch:
    """A micro-batch: the pairs' model inputs, the documents of each row (or 1 per pair) and the labels."""

    inputs: dict[str, Tensor]
    sizes: list[int]
    labels: Tensor
    real: bool = True  # False: a stand-in for a rank left without rows (its loss counts nothing)


class RerankTraining(Finetuning):
    """A `Finetuning` run whose loss is one of `RERANK_LOSSES` over the logits of a batch's pairs."""

    what, rows = "rerank fine-tuning", "rows"

    def __init__(self, model: Any, data: Encoded, evaluate: Callable[[], dict[str, Any]], cfg: Any,
                 main_metric: str, tokenizer: Any, rt: Any) -> None:
        self.rerank_rows: list[RerankRow] = data.examples
        self.pair_features = data.features
        self.loss = RERANK_LOSSES[cfg.loss or DEFAULT_RERANK_LOSS]
        self.tokenizer = tokenizer
        self.max_pair_length = Rerank().max_length(cfg.data_options(), model.config)  # mnrl's pairs made per batch
        starts = np.cumsum([0] + [len(r.documents) for r in self.rerank_rows])
        self.row_pairs = [list(range(starts[i], starts[i + 1])) for i in range(len(self.rerank_rows))]
        self.pair_labels = [v for row in self.rerank_rows for v in row.labels or [0.0] * len(row.documents)]
        if self.loss.batches == "pairs":  # the units a batch holds: pairs, or rows (their pairs together)
            units = [[p] for p in range(len(data.features))]
        else:
            units = self.row_pairs
        if self.loss.batches == "in-batch":
            self.check_in_batch_rows(data.path)
        self.units = units
        self.unit_lengths = [sum(len(data.features[p]["input_ids"]) for p in unit) for unit in units]
        super().__init__(model, units, evaluate, cfg, main_metric, False, tokenizer.pad_token_id, rt.device, rt)

    def check_in_batch_rows(self, path: Path) -> None:
        """`mnrl` rows are (query, positive, negatives...), all with the same number of documents."""
        for row in self.rerank_rows:
            labels = row.labels or []
            if not labels or labels[0] != 1.0 or any(v != 0.0 for v in labels[1:]):
                raise BertforgeError(f"{path}:{row.line}: --loss mnrl takes rows of a query, its positive (label 1) "
                                     "and hard negatives (label 0): mine-negatives' rows, or pairs labelled 1")
        widths = {len(row.documents) for row in self.rerank_rows}
        if len(widths) > 1:
            raise BertforgeError(f"{path}: --loss mnrl needs the same number of documents in every row, found "
                                 f"{', '.join(map(str, sorted(widths)))}")

    def epoch_batches(self) -> list[list[int]]:
        return training_batches(self.unit_lengths, self.cfg.batch_size, self.generator, self.cfg.group_by_length)

    def make_batch(self, indices: list[int]) -> RerankBatch:
        share, real = rank_share(indices, self.rt)
        if self.loss.batches == "in-batch":
            return self.in_batch(share, real)
        pairs = [p for u in share for p in self.units[u]]
        sizes = [len(self.units[u]) for u in share]
        inputs = collate([self.pair_features[p] for p in pairs], self.pad_token_id)
        return RerankBatch(inputs, sizes, torch.tensor([self.pair_labels[p] for p in pairs]), real)

    def in_batch(self, share: list[int], real: bool) -> RerankBatch:
        """Each row's `in_batch_candidates`, tokenized as pairs now."""
        rows = [self.rerank_rows[u] for u in share]
        chosen = in_batch_candidates(rows, self.generator)
        queries = [row.query for row, documents in zip(rows, chosen) for _ in documents]
        encoded = self.tokenizer(queries, [d for documents in chosen for d in documents], truncation=True,
                                 max_length=self.max_pair_length)
        features = [{"input_ids": ids, "token_type_ids": types}
                    for ids, types in zip(encoded["input_ids"], encoded["token_type_ids"])]
        return RerankBatch(collate(features, self.pad_token_id), [len(chosen[0])] * len(rows),
                           torch.zeros(len(queries)), real)

    def counts(self, batch: RerankBatch) -> dict[str, int]:
        return {"loss": len(batch.sizes) if batch.real else 0}

    def forward_backward(self, batch: RerankBatch, weights: dict[str, float]) -> dict[str, Tensor]:  # type: ignore[override]
        with self.stepper.autocast():
            logits = self.train_model(**move(batch.inputs, self.device)).logits.view(-1).float()  # [pairs]
        loss = self.loss.fn(logits, batch.sizes, batch.labels.to(self.device))
        return {"loss": self.stepper.accumulate({"loss": loss}, weights)}
