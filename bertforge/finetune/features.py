"""Model inputs: tokenising examples into features, padding each batch to its own longest row, and batch orders.

A feature is a plain dict: "input_ids" and "token_type_ids" (lists of ints, no padding; a multiple-choice
example's are one such list per choice) and the targets the model's head takes ("labels" — an int, a float, a
multi-label example's multi-hot tuple of floats or, for token classification, a list of ints — or
"start_positions" / "end_positions"). Padding happens per batch in `collate`, so a batch of short sentences costs
what short sentences cost; `training_batches` groups sentences of similar length to cut padding further.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..core.constants import IGNORE_INDEX
from .data import TaggedSentence, TextExample

Feature = dict[str, Any]

# How many batches a training "mega-batch" spans: its examples are sorted by length before being cut into batches.
GROUPING_SPAN = 50


def encode_classification(
    tokenizer: Any, examples: Sequence[TextExample], max_length: int, labels: Sequence[int | float | tuple[float, ...]] | None
) -> list[Feature]:
    """[CLS] text [SEP] (or [CLS] text [SEP] pair [SEP], segment ids 0 then 1), truncated to `max_length`."""
    texts = [e.text for e in examples]
    pairs = [e.text_pair or "" for e in examples] if any(e.text_pair is not None for e in examples) else None
    encoded = tokenizer(texts, pairs, truncation=True, max_length=max_length)
    features = []
    for i in range(len(examples)):
        feature: Feature = {"input_ids": encoded["input_ids"][i], "token_type_ids": encoded["token_type_ids"][i]}
        if labels is not None:
            feature["labels"] = labels[i]
        features.append(feature)
    return features


def encode_tagged(
    tokenizer: Any, sentences: Sequence[TaggedSentence], max_length: int, tag_ids: Sequence[list[int]] | None
) -> list[Feature]:
    """Sub-word inputs for tagged words. Each word's tag goes on its first sub-token; its other sub-tokens and the
    special tokens get IGNORE_INDEX (-100), so the loss and the predictions use one position per word.

    Every feature keeps "word_starts": the token position of each word's first sub-token, or -1 for a word that
    lost all its tokens (cut by truncation, or made of characters the normaliser removes).
    """
    encoded = tokenizer(
        [s.words for s in sentences], is_split_into_words=True, truncation=True, max_length=max_length,
        return_word_ids=True,
    )
    features = []
    for i, sentence in enumerate(sentences):
        word_starts = [-1] * len(sentence.words)
        for position, word in enumerate(encoded["word_ids"][i]):
            if word is not None and word_starts[word] == -1:
                word_starts[word] = position
        feature: Feature = {
            "input_ids": encoded["input_ids"][i],
            "token_type_ids": encoded["token_type_ids"][i],
            "word_starts": word_starts,
        }
        if tag_ids is not None:
            labels = [IGNORE_INDEX] * len(feature["input_ids"])
            for word, position in enumerate(word_starts):
                if position >= 0:
                    labels[position] = tag_ids[i][word]
            feature["labels"] = labels
        features.append(feature)
    return features


def is_choices(feature: Feature) -> bool:
    """Whether `feature` is a multiple-choice example's: a list of token ids per choice."""
    ids = feature["input_ids"]
    return bool(ids) and isinstance(ids[0], list)


def feature_length(feature: Feature) -> int:
    """The tokens a feature's longest row has (of a multiple-choice example, its longest choice's): what batches
    are sorted by and padded to."""
    if is_choices(feature):
        return max(len(ids) for ids in feature["input_ids"])
    return len(feature["input_ids"])


def collate_choices(features: Sequence[Feature], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Multiple-choice examples (every one with the same number of choices, C) padded to the batch's longest
    choice: input_ids, token_type_ids and attention_mask [B, C, S], labels (the right choice's index) [B]."""
    choices = len(features[0]["input_ids"])
    rows = [{"input_ids": ids, "token_type_ids": types}
            for f in features for ids, types in zip(f["input_ids"], f["token_type_ids"])]
    flat = collate(rows, pad_token_id)  # [B * C, S]
    out = {k: v.view(len(features), choices, -1) for k, v in flat.items()}
    if "labels" in features[0]:
        out["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)  # [B]
    return out


def collate(features: Sequence[Feature], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest row: input_ids with `pad_token_id`, token_type_ids with 0, per-token labels with
    -100; attention_mask is 1 on real tokens. Scalar targets become a [B] tensor (float for regression), multi-hot
    tuples a float [B, num_labels] one. Multiple-choice examples: `collate_choices`."""
    if is_choices(features[0]):
        return collate_choices(features, pad_token_id)
    length = max(len(f["input_ids"]) for f in features)
    batch = len(features)
    input_ids = torch.full((batch, length), pad_token_id, dtype=torch.long)  # [B, S]
    token_type_ids = torch.zeros((batch, length), dtype=torch.long)  # [B, S]
    attention_mask = torch.zeros((batch, length), dtype=torch.long)  # [B, S]
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        input_ids[row, :n] = torch.tensor(f["input_ids"])
        token_type_ids[row, :n] = torch.tensor(f["token_type_ids"])
        attention_mask[row, :n] = 1
    out = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
    if "labels" in features[0]:
        first = features[0]["labels"]
        if isinstance(first, list):
            labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)  # [B, S]
            for row, f in enumerate(features):
                labels[row, : len(f["labels"])] = torch.tensor(f["labels"])
            out["labels"] = labels
        elif isinstance(first, tuple):  # multi-label: one multi-hot row per example
            out["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float)  # [B, num_labels]
        else:
            dtype = torch.float if isinstance(first, float) else torch.long
            out["labels"] = torch.tensor([f["labels"] for f in features], dtype=dtype)  # [B]
    for key in ("start_positions", "end_positions"):
        if key in features[0]:
            out[key] = torch.tensor([f[key] for f in features], dtype=torch.long)  # [B]
    return out


def training_batches(
    lengths: Sequence[int], batch_size: int, generator: torch.Generator, group_by_length: bool
) -> list[list[int]]:
    """One epoch's batches of example indices, in an order drawn from `generator`.

    With `group_by_length`, the shuffled examples are cut into spans of GROUPING_SPAN batches, each span is sorted
    by length and cut into batches, and the batch order is shuffled again: every batch holds examples of similar
    length (little padding) while epochs still differ and no batch is biased towards any class.
    """
    order = torch.randperm(len(lengths), generator=generator).tolist()
    if not group_by_length:
        return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    span = batch_size * GROUPING_SPAN
    batches: list[list[int]] = []
    for start in range(0, len(order), span):
        chunk = sorted(order[start : start + span], key=lambda i: -lengths[i])
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def inference_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of indices sorted by length (the least padding), for evaluation and prediction."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
