"""`bertforge.finetune.qa`: SQuAD answers from the windows' logits, mapped back to the context's characters."""

from __future__ import annotations

import numpy as np

from bertforge.finetune.squad import QAExample
from bertforge.finetune.qa import Window, best_answers


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
