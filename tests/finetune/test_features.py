"""Encoding (`bertforge.finetune.features`): sub-token label alignment, sentence pairs, dynamic padding, batch
orders. (QA windows and offsets: tests/data/test_qa_spans.py.)"""

import pytest
import torch

from bertforge.finetune.data import TaggedSentence, TextExample
from bertforge.finetune.features import (collate, encode_classification, encode_tagged, feature_length,
                                        training_batches)
from bertforge.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    return Tokenizer.from_pretrained(tiny_model)


def test_labels_on_first_subtoken_only(tiny_tokenizer):
    sentence = TaggedSentence(["john", "visits", "amsterdam", "."], ["B-PER", "O", "B-LOC", "O"], 1)
    tag_ids = [[1, 0, 2, 0]]
    (feature,) = encode_tagged(tiny_tokenizer, [sentence], 64, tag_ids)
    tokens = tiny_tokenizer.convert_ids_to_tokens(feature["input_ids"])
    # "visits" (spelled out letter by letter) and "amsterdam" split into several pieces; only the first piece of
    # each word carries its tag
    assert tokens == ["[CLS]", "john", "v", "##i", "##s", "##i", "##t", "##s", "am", "##ster", "##dam", ".", "[SEP]"]
    starts = feature["word_starts"]
    assert starts == [1, 2, 8, 11]
    expected = [-100] * len(tokens)
    for word, position in enumerate(starts):
        expected[position] = tag_ids[0][word]
    assert feature["labels"] == expected
    assert sum(label != -100 for label in feature["labels"]) == 4


def test_truncated_words_are_marked(tiny_tokenizer):
    sentence = TaggedSentence(["amsterdam"] * 5, ["B-LOC"] * 5, 1)
    (feature,) = encode_tagged(tiny_tokenizer, [sentence], 8, [[1] * 5])
    assert len(feature["input_ids"]) == 8
    assert feature["word_starts"] == [1, 4, -1, -1, -1]  # 6 content tokens fit: two whole words


def test_sentence_pair_segments(tiny_tokenizer):
    examples = [TextExample("good movie", "bad plot", "pos", 2), TextExample("fun", "", "neg", 3)]
    features = encode_classification(tiny_tokenizer, examples, 32, [1, 0])
    tokens = tiny_tokenizer.convert_ids_to_tokens(features[0]["input_ids"])
    assert tokens == ["[CLS]", "good", "movie", "[SEP]", "bad", "plot", "[SEP]"]
    assert features[0]["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]
    assert features[0]["labels"] == 1


def test_collate_pads_per_batch():
    features = [
        {"input_ids": [2, 7, 3], "token_type_ids": [0, 0, 0], "labels": [-100, 4, -100]},
        {"input_ids": [2, 7, 8, 9, 3], "token_type_ids": [0, 0, 0, 1, 1], "labels": [-100, 1, 2, 0, -100]},
    ]
    batch = collate(features, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[2, 7, 3, 0, 0], [2, 7, 8, 9, 3]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0, 0, 0], [0, 0, 0, 1, 1]]
    assert batch["labels"].tolist() == [[-100, 4, -100, -100, -100], [-100, 1, 2, 0, -100]]
    regression = collate([{"input_ids": [1], "token_type_ids": [0], "labels": 0.5}], 0)
    assert regression["labels"].dtype == torch.float32
    qa = collate([{"input_ids": [1, 2], "token_type_ids": [0, 1], "start_positions": 1, "end_positions": 1}], 0)
    assert qa["start_positions"].tolist() == [1]


def test_collate_pads_multiple_choice_examples_to_the_longest_choice():
    """An example of C choices (a list of ids per choice) is C rows of the batch's [B, C, S]; its label is the
    right choice's index, and its length (what batches sort by) its longest choice's."""
    features = [{"input_ids": [[2, 7, 3], [2, 7, 8, 3]], "token_type_ids": [[0, 0, 1], [0, 0, 1, 1]], "labels": 1},
                {"input_ids": [[2, 3], [2, 9, 3]], "token_type_ids": [[0, 1], [0, 1, 1]], "labels": 0}]
    assert [feature_length(f) for f in features] == [4, 3]
    batch = collate(features, pad_token_id=0)
    assert batch["input_ids"].tolist() == [[[2, 7, 3, 0], [2, 7, 8, 3]], [[2, 3, 0, 0], [2, 9, 3, 0]]]
    assert batch["attention_mask"].tolist() == [[[1, 1, 1, 0], [1, 1, 1, 1]], [[1, 1, 0, 0], [1, 1, 1, 0]]]
    assert batch["token_type_ids"][1].tolist() == [[0, 1, 0, 0], [0, 1, 1, 0]]
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long


def test_training_batches_are_seeded_and_grouped():
    lengths = [(i * 37) % 101 + 1 for i in range(1000)]
    order = lambda seed: training_batches(lengths, 16, torch.Generator().manual_seed(seed), True)  # noqa: E731
    batches = order(1)
    assert sorted(i for b in batches for i in b) == list(range(1000))
    assert batches == order(1) and batches != order(2)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    plain = training_batches(lengths, 16, torch.Generator().manual_seed(1), group_by_length=False)
    padded_plain = sum(len(b) * max(lengths[i] for i in b) for b in plain)
    assert padded < 0.7 * padded_plain  # grouping cuts the padded tokens
