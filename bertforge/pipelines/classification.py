"""Text classification (one label per text or text pair) and token classification (entities with character spans).

Both follow transformers' pipelines of the same names: the same score functions, the same sub-word-to-word and
B-/I- grouping rules, so the labels and scores agree on the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..core.errors import BertforgeError
from ..model import BertForSequenceClassification, BertForTokenClassification, BertPreTrainedModel
from .base import Feature, Pipeline
from ..model.attention import PackedBatch

SCORE_FUNCTIONS = ("softmax", "sigmoid", "none")
AGGREGATIONS = ("none", "simple", "first", "average", "max")
_HEADLESS_HINT = "fine-tune one with `bertforge finetune --task {task} --model DIR --train FILE --dev FILE --out DIR`"


def _labels(model: BertPreTrainedModel) -> dict[int, str]:
    config = model.config
    return dict(config.id2label) if config.id2label else {i: f"LABEL_{i}" for i in range(config.num_labels)}


def _check_architecture(model: BertPreTrainedModel, source: str, wanted: str, task: str) -> None:
    """A checkpoint saved from another head class (say token classification for text classification) has a
    `classifier.*` of the same shape: refuse it by its recorded architecture rather than give nonsense."""
    heads = {"BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering"}
    recorded = [a for a in (model.config.architectures or []) if a in heads]
    if recorded and wanted not in recorded:
        raise BertforgeError(f"{source} is a {recorded[0]} checkpoint, not {wanted}: it cannot do {task}")


class TextClassificationPipeline(Pipeline):
    """`pipeline("text-classification", model=DIR)`: a text, a (text, text_pair) tuple or a
    {"text", "text_pair"} dict → {"label", "score"}; a list of them → a list of results.

    Args:
        top_k: 1 (default) gives the best {"label", "score"}; k > 1 or None gives a list of the k best (None:
            all labels), best first.
        function_to_apply: "softmax", "sigmoid" or "none"; by default, as transformers: none for regression,
            sigmoid for multi-label or one-label models, softmax otherwise.
        threshold: gives, for each input, a list of every label whose score is at least this, best first (maybe
            none): a multi-label model's labels with `threshold=0.5`, as `bertforge predict` gives them. It
            replaces top_k.
    """

    task = "text-classification"
    input_description = 'a string, a (text, text_pair) tuple or a {"text", "text_pair"} dict'
    model_class = BertForSequenceClassification

    def __init__(self, model: Any, *, top_k: int | None = 1, function_to_apply: str | None = None,
                 threshold: float | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.id2label = _labels(self.model)
        self.set_top_k(top_k)
        self.set_threshold(threshold)
        self.set_function_to_apply(function_to_apply)

    call_options = (*Pipeline.call_options, "top_k", "function_to_apply", "threshold")
    refused_options = {
        **Pipeline.refused_options,
        "stride": "a text over max_length is cut, not windowed; set max_length=N",
        "add_special_tokens": "the model's special tokens are always added, as the model was trained with them",
        "return_token_type_ids": "token type ids are always made, for text pairs",
    }

    def set_top_k(self, top_k: Any) -> None:
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise BertforgeError(f"text-classification: top_k must be a positive integer or None, got {top_k!r}")
        self.top_k = top_k

    def set_threshold(self, threshold: Any) -> None:
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))):
            raise BertforgeError(f"text-classification: threshold must be a number or None, got {threshold!r}")
        self.threshold = threshold

    def set_function_to_apply(self, function_to_apply: Any) -> None:
        """The score function; None: as transformers picks it, from the model's config."""
        config = self.model.config
        if function_to_apply is None:
            if config.problem_type == "regression":
                function_to_apply = "none"
            elif config.problem_type == "multi_label_classification" or config.num_labels == 1:
                function_to_apply = "sigmoid"
            else:
                function_to_apply = "softmax"
        function_to_apply = getattr(function_to_apply, "value", function_to_apply)  # transformers' enum
        if not isinstance(function_to_apply, str) or function_to_apply.lower() not in SCORE_FUNCTIONS:
            raise BertforgeError(f"function_to_apply must be one of {', '.join(SCORE_FUNCTIONS)}, got {function_to_apply!r}")
        self.function_to_apply = function_to_apply.lower()

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        _check_architecture(model, source, "BertForSequenceClassification", self.task)
        missing = [prefix for prefix in model.head_prefixes() if self.missing(model, prefix)]
        if missing:
            part = missing[0] + "*"
            raise BertforgeError(
                f"{source} has no sequence-classification head ({part} is not in the checkpoint): "
                + _HEADLESS_HINT.format(task="classification")
            )

    @staticmethod
    def split(item: Any) -> tuple[Any, Any]:
        """(text, text_pair or None) of an input."""
        if isinstance(item, Mapping):
            return item.get("text"), item.get("text_pair")
        if isinstance(item, tuple) and len(item) == 2:
            return item
        return item, None

    def is_single(self, inputs: Any) -> bool:
        return isinstance(inputs, (str, Mapping)) or (isinstance(inputs, tuple) and len(inputs) == 2)

    def check_input(self, item: Any, index: int) -> None:
        text, pair = self.split(item)
        if not isinstance(text, str) or (pair is not None and not isinstance(pair, str)):
            raise BertforgeError(
                f"{self.task}: input {index} must be {self.input_description} of strings, got {item!r:.80}"
            )

    def featurize(self, inputs: list[Any]) -> tuple[list[Feature], int]:
        split = [self.split(item) for item in inputs]
        singles = [i for i, (_, pair) in enumerate(split) if pair is None]
        pairs = [i for i, (_, pair) in enumerate(split) if pair is not None]
        features: list[Feature] = []
        truncated = 0
        for indices, with_pair in ((singles, False), (pairs, True)):
            enc, cut = self.encode(
                [split[i][0] for i in indices], [split[i][1] for i in indices] if with_pair else None
            )
            truncated += cut
            for i, ids, types in zip(indices, enc["input_ids"], enc["token_type_ids"]):
                features.append(Feature(i, ids, types if with_pair else None))
        return features, truncated

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[np.ndarray]:
        model: BertForSequenceClassification = self.model  # type: ignore[assignment]
        return list(model.packed_logits(hidden, batch).float().cpu().numpy())  # [B, num_labels]

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """One input's label scores (float64) from its logits, by `function_to_apply`."""
        logits = logits.astype(np.float64)
        if self.function_to_apply == "softmax":
            scores = np.exp(logits - logits.max())
            return scores / scores.sum()
        if self.function_to_apply == "sigmoid":
            return 1.0 / (1.0 + np.exp(-logits))
        return logits

    def postprocess(self, item: Any, outputs: list[np.ndarray], features: list[Feature]) -> Any:
        scores = self.scores(outputs[0])
        if self.threshold is not None:
            order = [int(i) for i in np.argsort(-scores, kind="stable") if scores[i] >= self.threshold]
            return [{"label": self.id2label[i], "score": float(scores[i])} for i in order]
        if self.top_k == 1:
            best = int(scores.argmax())
            return {"label": self.id2label[best], "score": float(scores[best])}
        top = np.argsort(-scores, kind="stable")[: self.top_k]
        return [{"label": self.id2label[int(i)], "score": float(scores[i])} for i in top]


class TokenClassificationPipeline(Pipeline):
    """`pipeline("token-classification", model=DIR)`: a text → its entities, each a dict with "entity_group"
    (or "entity" and "index" without aggregation), "score", "word", and the character span "start", "end".

    Args:
        aggregation_strategy: "first" (default: a word takes its first sub-token's label; adjacent words with the
            same tag, B-/I- aware, form one entity), "average" / "max" (a word's label from its sub-tokens' mean
            scores / its most confident sub-token), "simple" (sub-tokens grouped without word boundaries) or
            "none" (one result per sub-token). Same rules as transformers' pipeline.
        ignore_labels: labels left out of the results (default ["O"]).
    """

    task = "token-classification"
    model_class = BertForTokenClassification

    def __init__(
        self, model: Any, *, aggregation_strategy: str = "first", ignore_labels: list[str] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(model, **kwargs)
        self.set_aggregation_strategy(aggregation_strategy)
        self.set_ignore_labels(ignore_labels)
        self.id2label = _labels(self.model)

    call_options = (*Pipeline.call_options, "aggregation_strategy", "ignore_labels")
    refused_options = {
        **Pipeline.refused_options,
        "stride": "a text over max_length is cut (with a warning), not windowed; set max_length=N",
        "is_split_into_words": "give each text as one string (words joined by spaces); offsets are its characters'",
        "delimiter": "give each text as one string (words joined by spaces); offsets are its characters'",
        "offset_mapping": "offsets come from the tokenizer's own character spans",
    }

    def set_aggregation_strategy(self, aggregation_strategy: Any) -> None:
        aggregation_strategy = getattr(aggregation_strategy, "value", aggregation_strategy)  # transformers' enum
        if not isinstance(aggregation_strategy, str) or aggregation_strategy.lower() not in AGGREGATIONS:
            raise BertforgeError(f"aggregation_strategy must be one of {', '.join(AGGREGATIONS)}, got {aggregation_strategy!r}")
        self.aggregation = aggregation_strategy.lower()

    def set_ignore_labels(self, ignore_labels: Any) -> None:
        """Labels left out of the results; None: ["O"]."""
        if ignore_labels is not None and (isinstance(ignore_labels, str) or not isinstance(ignore_labels, Iterable)):
            raise BertforgeError(f"token-classification: ignore_labels must be a list of labels, got {ignore_labels!r}")
        self.ignore_labels = set(ignore_labels if ignore_labels is not None else ["O"])

    def check_model(self, model: BertPreTrainedModel, source: str) -> None:
        _check_architecture(model, source, "BertForTokenClassification", self.task)
        if self.missing(model, "classifier."):
            raise BertforgeError(
                f"{source} has no token-classification head (classifier.* is not in the checkpoint): "
                + _HEADLESS_HINT.format(task="ner")
            )

    def featurize(self, inputs: list[str]) -> tuple[list[Feature], int]:
        enc, truncated = self.encode(inputs, return_offsets_mapping=True, return_special_tokens_mask=True)
        features = [
            Feature(i, ids, None, (offsets, special))
            for i, (ids, offsets, special) in enumerate(
                zip(enc["input_ids"], enc["offset_mapping"], enc["special_tokens_mask"])
            )
        ]
        return features, truncated

    def head(self, batch: PackedBatch, hidden: Tensor, features: list[Feature]) -> list[Tensor]:
        model: BertForTokenClassification = self.model  # type: ignore[assignment]
        probs = model.token_logits(hidden).float().softmax(dim=-1)  # [T, num_labels]
        return list(torch.split(probs.cpu(), batch.lengths))  # per sequence [len, num_labels]

    def postprocess(self, item: str, outputs: list[Tensor], features: list[Feature]) -> list[dict[str, Any]]:
        scores = outputs[0].numpy()  # [len, num_labels]
        feature = features[0]
        offsets, special = feature.extra
        tokens = []  # one per non-special token: its piece, scores, span, position, whether it continues a word
        for index, (token_id, (start, end), is_special) in enumerate(zip(feature.input_ids, offsets, special)):
            if is_special:
                continue
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            while start < end and item[start].isspace():  # byte-level pieces without trimmed offsets (ModernBERT's)
                start += 1  # carry the space before the word
            original = item[start:end]
            # a word piece: "##ing" (WordPiece), a byte-level or Unigram piece not opening with "Ġ" / "▁"
            continues = self.tokenizer.kind.is_continuation(piece)
            if token_id == self.tokenizer.unk_token_id:
                piece, continues = original, False
            tokens.append({"word": piece, "scores": scores[index], "start": start, "end": end, "index": index,
                           "is_subword": continues})
        if self.aggregation in ("none", "simple"):
            entities = [self._token_entity(t) for t in tokens]
        else:
            entities = self._word_entities(tokens)
        if self.aggregation != "none":
            entities = self._group(entities)
        key = "entity" if self.aggregation == "none" else "entity_group"
        return [e for e in entities if e[key] not in self.ignore_labels]

    def _token_entity(self, token: dict[str, Any]) -> dict[str, Any]:
        best = int(token["scores"].argmax())
        return {"entity": self.id2label[best], "score": float(token["scores"][best]), "index": token["index"],
                "word": token["word"], "start": token["start"], "end": token["end"]}

    def _join(self, pieces: list[str]) -> str:
        decoder = self.tokenizer.backend.decoder
        return decoder.decode(pieces).strip() if decoder is not None else " ".join(pieces)

    def _word_entities(self, tokens: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One entity per word (a token and the sub-word pieces after it), labelled by the strategy."""
        words: list[list[dict[str, Any]]] = []
        for token in tokens:
            if words and token["is_subword"]:
                words[-1].append(token)
            else:
                words.append([token])
        entities = []
        for pieces in words:
            if self.aggregation == "first":
                scores = pieces[0]["scores"]
            elif self.aggregation == "max":
                scores = max(pieces, key=lambda t: t["scores"].max())["scores"]
            else:  # average
                scores = np.nanmean(np.stack([t["scores"] for t in pieces]), axis=0)
            best = int(scores.argmax())
            entities.append({"entity": self.id2label[best], "score": float(scores[best]),
                             "word": self._join([t["word"] for t in pieces]),
                             "start": pieces[0]["start"], "end": pieces[-1]["end"]})
        return entities

    @staticmethod
    def _tag(label: str) -> tuple[str, str]:
        """("B" or "I", type) of a label; a label without a B-/I- prefix counts as a continuation."""
        if label.startswith(("B-", "I-")):
            return label[0], label[2:]
        return "I", label

    def _group(self, entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Merge adjacent entities of one type into groups; a B- tag always starts a new group."""
        groups: list[list[dict[str, Any]]] = []
        for entity in entities:
            bi, tag = self._tag(entity["entity"])
            if groups and tag == self._tag(groups[-1][-1]["entity"])[1] and bi != "B":
                groups[-1].append(entity)
            else:
                groups.append([entity])
        return [
            {
                "entity_group": group[0]["entity"].split("-", 1)[-1],
                "score": float(np.nanmean([e["score"] for e in group])),
                "word": self._join([e["word"] for e in group]),
                "start": group[0]["start"],
                "end": group[-1]["end"],
            }
            for group in groups
        ]
