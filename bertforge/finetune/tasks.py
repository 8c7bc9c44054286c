"""The fine-tuning tasks behind one interface, so that training, evaluation and prediction are task-free.

A task reads its files, derives the label space from the training data (the `config.json` overrides:
`id2label`, `label2id`, `problem_type`, ...), encodes examples into features (rejecting labels the model does not
know), turns the model's raw outputs into metrics and into prediction records.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..model.config import BertConfig
from ..core.errors import BertforgeError
from ..model import (BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                     BertPreTrainedModel)
from ..data.tables import InMemory
from ..data.qa_spans import NULL_ANSWER_KEY  # config.json: the model was trained to say "no answer"
from . import metrics as M
from .config import DEFAULT_LABEL_COLUMN, DataOptions
from .data import TaggedSentence, TextExample, read_classification
from .tagged import name_tag_ids, read_tagged
from .squad import SQUAD_COLUMNS, QAExample, read_squad
from .features import Feature, encode_classification, encode_tagged
from .qa import Answer, Window, best_answers, encode_qa

log = logging.getLogger("bertforge")

Output = dict[str, np.ndarray]  # one feature's model outputs, trimmed to its length


@dataclass
class Encoded:
    """A file's examples, their features, and what maps features back to examples (QA windows)."""

    path: Path
    examples: list[Any]
    features: list[Feature]
    windows: list[Window] = field(default_factory=list)
    version_2: bool = False  # qa: the data has unanswerable questions


class Task(ABC):
    """What training, evaluation and prediction need to know about a task."""

    name: str
    model_class: type[BertPreTrainedModel]
    default_max_length = 128
    # Metric names a task reports; the first is the default main metric.
    metric_names: tuple[str, ...] = ()

    @abstractmethod
    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[Any], bool]:
        """The examples of a file, and (for qa) whether it is SQuAD 2.0."""

    @abstractmethod
    def label_overrides(self, examples: list[Any], path: Path) -> dict[str, Any]:
        """The config.json fields that the training data decides."""

    @abstractmethod
    def encode(
        self, tokenizer: Any, examples: list[Any], opts: DataOptions, config: BertConfig, path: Path, labelled: bool
    ) -> Encoded:
        """Features for the model; with `labelled`, targets too, and an error for a label the model lacks."""

    def check_trainable(self, data: Encoded) -> None:  # noqa: B027 (a hook: accepts all by default)
        """Refuse training data the task's objective cannot learn from (after `encode`, so what the model reads)."""

    def main_metric(self, config: BertConfig, requested: str | None) -> str:
        """The metric that picks the best checkpoint: `requested`, or the task's default."""
        names = self.metrics_for(config)
        if requested is None:
            return names[0]
        if requested not in names:
            raise BertforgeError(f"--metric {requested!r} is not reported for {self.name}; choose one of: {', '.join(names)}")
        return requested

    def metrics_for(self, config: BertConfig) -> tuple[str, ...]:
        """The metrics that can pick the best checkpoint of this model; the first is the default."""
        return self.metric_names

    @abstractmethod
    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        """The task's metrics from the model's outputs for every feature."""

    @abstractmethod
    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        """One JSON-ready prediction per example."""

    def sequences_per_example(self, examples: list[Any], cfg: Any) -> int:
        """The model inputs one example of `--batch-size` makes (what the memory estimate multiplies the batch by)."""
        return 1

    def save_files(self, directory: Path, versions: dict[str, str]) -> None:  # noqa: B027 (a hook: none by default)
        """Files of the task's own beside the fine-tuned checkpoint in `directory`."""

    def training(self, model: Any, data: Encoded, evaluate: Callable[[], dict[str, Any]], cfg: Any, main_metric: str,
                 tokenizer: Any, rt: Any) -> Any:
        """The run that trains `model` on `data` (a `trainer.Finetuning`: the model's own loss on the features)."""
        from .trainer import Finetuning

        return Finetuning(model, data.features, evaluate, cfg, main_metric, lower_is_better(main_metric),
                          tokenizer.pad_token_id, rt.device, rt)

    def max_length(self, opts: DataOptions, config: BertConfig) -> int:
        """`--max-length`, or the task's default capped at the model's positions."""
        length = opts.max_length or min(self.default_max_length, config.max_sequence_length)
        config.check_sequence_length(length, "--max-length")
        return length


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is the better one (mean squared error)."""
    return metric == "mse"


# ---------------------------------------------------------------------------------------------------- classification


def _number(value: Any) -> float | None:
    """The value as a finite float, or None when it is not a number."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _written_as_float(value: Any) -> bool:
    """A JSON float, or a string number with a decimal point or an exponent ("0.5", "4.000", "1e-3")."""
    if isinstance(value, float):
        return True
    return isinstance(value, str) and _number(value) is not None and any(c in value for c in ".eE")


def _label_key(value: Any) -> str:
    """The name a label has in `label2id`: ints and integer strings as their plain digits ("01" and 1 → "1")."""
    text = str(value).strip()
    if isinstance(value, int) or (text.lstrip("-").isdigit()):
        return str(int(text))
    return text


def check_numeric_labels(examples: list[TextExample], path: Path) -> None:
    """Labels that are mostly numbers are numbers: a non-number among them ("n/a", an empty cell read as text, or a
    number that is not finite: "nan", "inf") is refused naming its line, rather than turning every label into a
    class name (or regression into classification)."""
    odd = [e for e in examples if _number(e.label) is None]
    if not odd or len(odd) * 2 >= len(examples):
        return
    first = odd[0]
    what = "not a finite number" if _is_float(first.label) else "not a number"
    raise BertforgeError(
        f"{path}:{first.line}: label {first.label!r} is {what}, but {len(examples) - len(odd)} of the "
        f"{len(examples)} labels are numbers ({len(odd)} are not); fix or drop such rows"
    )


def _is_float(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return not isinstance(value, bool)


class Classification(Task):
    """Sentence or sentence-pair classification; regression when the training labels are written as floats."""

    name = "classification"
    model_class = BertForSequenceClassification
    metric_names = ("accuracy", "f1", "macro_f1", "mcc")
    regression_metric_names = ("pearson", "spearman", "mse")
    multi_label_metric_names = ("micro_f1", "macro_f1", "subset_accuracy")

    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[TextExample], bool]:
        examples = read_classification(
            path, opts.text_column, opts.text_pair_column, opts.label_column, opts.no_header, require_labels=labelled,
            lenient=opts.lenient_rows, label_separator=opts.label_separator,
        )
        return examples, False

    def label_overrides(self, examples: list[TextExample], path: Path) -> dict[str, Any]:
        values = [e.label for e in examples]
        if any(isinstance(v, list) for v in values):
            return _multi_label_overrides(values, path)
        check_numeric_labels(examples, path)
        numeric = all(_number(v) is not None for v in values)
        if numeric and any(_written_as_float(v) for v in values):
            whole = sorted({float(_number(v)) for v in values})  # type: ignore[arg-type]
            if all(x.is_integer() for x in whole):  # 0.0 / 1.0: pandas writes integer labels so beside a blank
                shown = ", ".join(f"{x:.1f}" for x in whole[:4]) + (", ..." if len(whole) > 4 else "")
                log.warning("%s: the labels are written as decimals (%s) but are whole numbers: fine-tuning a "
                            "regression (one output, MSE loss); for classes, write them as integers", path, shown)
            return {"num_labels": 1, "problem_type": "regression", "id2label": {0: "LABEL_0"}, "label2id": {"LABEL_0": 0}}
        keys = {_label_key(v) for v in values}
        names = sorted(keys, key=int) if numeric else sorted(keys)
        if len(names) < 2:
            raise BertforgeError(f"{path}: every example has the label {names[0]!r}; classification needs at least two")
        return _label_space(names, "single_label_classification")

    def metrics_for(self, config: BertConfig) -> tuple[str, ...]:
        """Correlations and MSE for a regression model, label-set metrics for a multi-label one, class metrics
        otherwise."""
        if _is_multi_label(config):
            return self.multi_label_metric_names
        return self.regression_metric_names if _is_regression(config) else self.metric_names

    def encode(
        self, tokenizer: Any, examples: list[TextExample], opts: DataOptions, config: BertConfig, path: Path,
        labelled: bool,
    ) -> Encoded:
        labels = None
        if labelled:
            labels = [self._label_id(e, config, path) for e in examples]
        features = encode_classification(tokenizer, examples, self.max_length(opts, config), labels)
        return Encoded(path, examples, features)

    def _label_id(self, example: TextExample, config: BertConfig, path: Path) -> int | float | tuple[float, ...]:
        """The target of an example: a class id, a number (regression), or a multi-hot tuple (multi-label, where a
        single label is a list of one)."""
        if _is_multi_label(config):
            hot = [0.0] * config.num_labels
            for value in example.label if isinstance(example.label, list) else [example.label]:
                hot[self._class_id(value, example.line, config, path)] = 1.0
            return tuple(hot)
        if isinstance(example.label, list):
            raise BertforgeError(f"{path}:{example.line}: a list of labels, but the model has one label per example "
                                 f"(its problem_type is {config.problem_type!r})")
        if _is_regression(config):
            number = _number(example.label)
            if number is None:
                raise BertforgeError(f"{path}:{example.line}: label {example.label!r} is not a number (the model does regression)")
            return number
        return self._class_id(example.label, example.line, config, path)

    @staticmethod
    def _class_id(label: Any, line: int, config: BertConfig, path: Path) -> int:
        label2id = config.label2id or {f"LABEL_{i}": i for i in range(config.num_labels)}
        key = _label_key(label)
        if key not in label2id and key.isdigit() and set(label2id) == {f"LABEL_{i}" for i in range(len(label2id))}:
            key = f"LABEL_{key}"  # transformers' default names: label i is LABEL_i
        if key not in label2id:
            known = ", ".join(sorted(label2id))
            raise BertforgeError(f"{path}:{line}: label {label!r} was not seen in training (known: {known})")
        return label2id[key]

    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        gold = [f["labels"] for f in data.features]
        if _is_multi_label(config):
            chosen = [np.flatnonzero(np.asarray(g)) for g in gold]
            return M.multi_label_metrics(chosen, [np.flatnonzero(_sigmoid(o["logits"]) >= MULTI_LABEL_THRESHOLD)
                                                  for o in outputs], config.num_labels)
        if _is_regression(config):
            return M.regression_metrics(gold, [float(o["logits"][0]) for o in outputs])
        pred = [int(o["logits"].argmax()) for o in outputs]
        return M.classification_metrics(gold, pred, config.num_labels)

    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        records = []
        for example, output in zip(data.examples, outputs):
            record: dict[str, Any] = {"line": example.line, "text": example.text}
            if example.text_pair is not None:
                record["text_pair"] = example.text_pair
            if _is_multi_label(config):
                record.update(_multi_label_record(output["logits"], config))
            elif _is_regression(config):
                record["score"] = float(output["logits"][0])
            else:
                probs = _softmax(output["logits"])
                best = int(probs.argmax())
                names = config.id2label or {i: str(i) for i in range(len(probs))}
                record["label"] = names[best]
                record["score"] = float(probs[best])
                record["probabilities"] = {names[i]: float(p) for i, p in enumerate(probs)}
            records.append(record)
        return records


def _is_regression(config: BertConfig) -> bool:
    return config.problem_type == "regression" or config.num_labels == 1


def _is_multi_label(config: BertConfig) -> bool:
    return config.problem_type == "multi_label_classification" and config.num_labels > 1


MULTI_LABEL_THRESHOLD = 0.5  # a multi-label model predicts every label of probability (sigmoid) at least this


def _multi_label_overrides(values: list[Any], path: Path) -> dict[str, Any]:
    """The label space of multi-label training data: every label of every example's list (a single label counts
    as a list of one)."""
    keys = {_label_key(v) for labels in values for v in (labels if isinstance(labels, list) else [labels])}
    numeric = all(k.lstrip("-").isdigit() for k in keys)
    names = sorted(keys, key=int) if numeric else sorted(keys)
    if len(names) < 2:
        raise BertforgeError(f"{path}: the examples' labels are {names}; multi-label classification needs at least two")
    return _label_space(names, "multi_label_classification")


def _label_space(names: list[str], problem_type: str) -> dict[str, Any]:
    """The config fields of a classifier over the label `names` (in id order)."""
    return {"num_labels": len(names), "problem_type": problem_type, "id2label": dict(enumerate(names)),
            "label2id": {name: i for i, name in enumerate(names)}}


def _multi_label_record(logits: np.ndarray, config: BertConfig) -> dict[str, Any]:
    """A multi-label prediction: every label of probability at least the threshold, the likeliest first, and
    every label's probability."""
    probs = _sigmoid(logits)
    names = config.id2label or {i: str(i) for i in range(len(probs))}
    chosen = [int(i) for i in np.argsort(-probs, kind="stable") if probs[i] >= MULTI_LABEL_THRESHOLD]
    return {"labels": [{"label": names[i], "score": float(probs[i])} for i in chosen],
            "probabilities": {names[i]: float(p) for i, p in enumerate(probs)}}


def _sigmoid(logits: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------------- NER


class TokenClassification(Task):
    """Word tagging (NER) from CoNLL files or rows of words and tags; scored on entities, span by span."""

    name = "ner"
    model_class = BertForTokenClassification
    metric_names = ("f1", "precision", "recall", "accuracy")

    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[TaggedSentence], bool]:
        return read_tagged(path, opts.text_column, opts.label_column, labelled, _split_words), False

    def label_overrides(self, examples: list[TaggedSentence], path: Path) -> dict[str, Any]:
        tags = {t for s in examples for t in s.tags or []}
        if any(isinstance(t, int) for t in tags):
            raise BertforgeError(f"{path}: the tags are integer ids without their names; pass tags as strings, or a "
                                 "datasets.Dataset (or a Parquet file it wrote) whose tag column is a ClassLabel")
        names = (["O"] if "O" in tags else []) + sorted(tags - {"O"})
        if len(names) < 2:
            raise BertforgeError(f"{path}: every word has the tag {names[0]!r}; tagging needs at least two tags")
        return {"num_labels": len(names), "id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}

    def encode(
        self, tokenizer: Any, examples: list[TaggedSentence], opts: DataOptions, config: BertConfig, path: Path,
        labelled: bool,
    ) -> Encoded:
        tag_ids = None
        if labelled:
            name_tag_ids(path, examples, config.id2label)
            label2id = config.label2id or {}
            tag_ids = []
            for sentence in examples:
                for k, tag in enumerate(sentence.tags or []):
                    if tag not in label2id:
                        known = ", ".join(sorted(label2id))
                        raise BertforgeError(f"{path}:{sentence.word_line(k)}: tag {tag!r} was not seen in training (known: {known})")
                tag_ids.append([label2id[t] for t in sentence.tags or []])
        features = encode_tagged(tokenizer, examples, self.max_length(opts, config), tag_ids)
        return Encoded(path, examples, features)

    def predicted_tags(self, data: Encoded, outputs: list[Output], config: BertConfig) -> list[list[str]]:
        """Each word's tag: the argmax at its first sub-token; "O" for a word left without tokens."""
        names = config.id2label or {}
        tags = []
        for feature, output in zip(data.features, outputs):
            best = output["logits"].argmax(-1)  # [S]
            tags.append([names[int(best[p])] if p >= 0 else "O" for p in feature["word_starts"]])
        return tags

    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        return M.entity_metrics([s.tags for s in data.examples], self.predicted_tags(data, outputs, config))

    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        records = []
        for sentence, tags in zip(data.examples, self.predicted_tags(data, outputs, config)):
            entities = []
            for kind, start, end in M.entity_spans(tags):
                entity: dict[str, Any] = {"type": kind, "start": start, "end": end}
                if sentence.char_spans is not None:
                    char_start, char_end = sentence.char_spans[start][0], sentence.char_spans[end - 1][1]
                    entity.update(text=sentence.text[char_start:char_end], char_start=char_start, char_end=char_end)
                else:
                    entity["text"] = " ".join(sentence.words[start:end])
                entities.append(entity)
            record: dict[str, Any] = {"line": sentence.line}
            if sentence.text is not None:
                record["text"] = sentence.text
            record.update(tokens=sentence.words, tags=tags, entities=entities)
            records.append(record)
        return records


_WORD_SPLITTER: Any = None


def _split_words(text: str) -> list[tuple[str, tuple[int, int]]]:
    """BERT's pre-tokenisation (whitespace, then punctuation apart), with character offsets."""
    global _WORD_SPLITTER
    if _WORD_SPLITTER is None:
        from tokenizers.pre_tokenizers import BertPreTokenizer

        _WORD_SPLITTER = BertPreTokenizer()
    return _WORD_SPLITTER.pre_tokenize_str(text)


# ---------------------------------------------------------------------------------------------------- QA

class QuestionAnswering(Task):
    """Extractive QA on SQuAD v1.1 / v2.0: nested JSON files or flat rows (`squad.py`)."""

    name = "qa"
    model_class = BertForQuestionAnswering
    default_max_length = 384
    metric_names = ("f1", "exact")

    def read(self, path: str | Path | InMemory, opts: DataOptions, labelled: bool) -> tuple[list[QAExample], bool]:
        label = opts.label_column if opts.label_column != DEFAULT_LABEL_COLUMN else None  # 'label': squad's answers
        given = (opts.text_column, opts.text_pair_column, label)
        return read_squad(path, require_answers=labelled,
                          columns=tuple(g or d for g, d in zip(given, SQUAD_COLUMNS)))  # type: ignore[arg-type]

    def label_overrides(self, examples: list[QAExample], path: Path) -> dict[str, Any]:
        return {"num_labels": 2, NULL_ANSWER_KEY: any(e.is_impossible for e in examples)}

    def encode(
        self, tokenizer: Any, examples: list[QAExample], opts: DataOptions, config: BertConfig, path: Path,
        labelled: bool,
    ) -> Encoded:
        features, windows = encode_qa(
            tokenizer, examples, self.max_length(opts, config), opts.doc_stride, opts.max_query_length, labelled
        )
        return Encoded(path, examples, features, windows, any(e.is_impossible for e in examples))

    def check_trainable(self, data: Encoded) -> None:
        """Spans are learnt from windows that hold an answer: refuse a file where none does (every question
        unanswerable, or every answer beyond the tokens the model reads)."""
        if data.features and not any(f.get("start_positions", 0) > 0 for f in data.features):
            answerable = sum(not e.is_impossible for e in data.examples)
            why = ("every question is unanswerable" if not answerable else
                   f"none of its {answerable} answers lies inside the text the model reads (raise --max-length, or "
                   "check that answer_start points into each context)")
            raise BertforgeError(f"{data.path}: no training window holds an answer span ({why}); question answering "
                                 "learns spans from answers in their contexts")

    def answers(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[Answer]:
        allow_null = data.version_2 or bool(config.extra.get(NULL_ANSWER_KEY, False))
        return best_answers(
            data.examples, data.windows, [o["start_logits"] for o in outputs], [o["end_logits"] for o in outputs],
            opts.n_best, opts.max_answer_length, allow_null,
        )

    def score(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> dict[str, Any]:
        answers = self.answers(data, outputs, config, opts)
        ids = [e.id for e in data.examples]
        return M.squad_metrics(
            {q: a.text for q, a in zip(ids, answers)},
            {e.id: [text for text, _ in e.answers] for e in data.examples},
            span_predictions={q: a.span_text for q, a in zip(ids, answers)},
            null_margins={q: a.null_score - a.span_score for q, a in zip(ids, answers)},
        )

    def records(self, data: Encoded, outputs: list[Output], config: BertConfig, opts: DataOptions) -> list[dict]:
        return [
            {"id": e.id, "question": e.question, "answer": a.text, "start": a.start, "end": a.end,
             "score": a.score, "null_score": a.null_score}
            for e, a in zip(data.examples, self.answers(data, outputs, config, opts))
        ]


TASK_CLASSES: dict[str, type[Task]] = {"classification": Classification, "ner": TokenClassification, "qa": QuestionAnswering}


def get_task(name: str) -> Task:
    if name not in TASK_CLASSES:
        raise BertforgeError(f"unknown task {name!r}; choose one of: {', '.join(TASK_CLASSES)}")
    return TASK_CLASSES[name]()


from . import rerank  # noqa: E402,F401  (the reranking task registers itself: `rerank.Rerank`)
from . import multiple_choice  # noqa: E402,F401  (so does multiple choice: `multiple_choice.MultipleChoice`)
