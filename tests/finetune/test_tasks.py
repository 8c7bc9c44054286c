"""`bertforge.finetune.tasks`: each task's label space, derived from the training data."""

from __future__ import annotations

import pytest

from bertforge import BertforgeError
from bertforge.finetune.tasks import Classification


def test_label_kinds(tmp_path):
    task = Classification()
    examples = lambda labels: [type("E", (), {"label": v})() for v in labels]  # noqa: E731
    ints = task.label_overrides(examples(["1", "0", "10", "2"]), tmp_path)
    assert ints["id2label"] == {0: "0", 1: "1", 2: "2", 3: "10"}  # numeric order, not string order
    strings = task.label_overrides(examples(["pos", "neg", "neutral"]), tmp_path)
    assert strings["label2id"] == {"neg": 0, "neutral": 1, "pos": 2}
    floats = task.label_overrides(examples(["0.5", "4.000", "1"]), tmp_path)
    assert floats["problem_type"] == "regression" and floats["num_labels"] == 1
    with pytest.raises(BertforgeError, match="at least two"):
        task.label_overrides(examples(["a", "a"]), tmp_path)
