"""`bertforge.finetune.config`: a run's `FinetuneConfig` saved as finetune_config.json reads back the same, and each
bad setting is refused by name."""

from __future__ import annotations

import json
import re

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.finetune.config import DataOptions, FinetuneConfig

PATHS = dict(task="classification", model="m", train="t.tsv", dev="d.tsv", out="o")


def test_a_saved_config_reads_back_the_same(tmp_path):
    config = FinetuneConfig(**PATHS, epochs=2, lr=3e-5, max_length=64, text_pair_column="b", layer_lr_decay=0.8)
    config.validate()
    path = tmp_path / "finetune_config.json"
    path.write_text(json.dumps({**config.to_dict(), "versions": {"bertforge": "0.0"}}))  # "versions": information only
    again = FinetuneConfig.from_json(path)
    assert again == config and again.to_dict() == config.to_dict()
    assert again.data_options() == DataOptions(max_length=64, text_pair_column="b")


@pytest.mark.parametrize("settings, message", [
    (dict(epochs=0), "epochs must be an integer >= 1, got 0"),
    (dict(seed=True), "seed must be an integer >= 0, got True"),
    (dict(lr=2.0), r"lr must be a number in \(0, 1\), got 2.0"),
    (dict(task="pos"), "task must be one of classification, ner, qa, rerank, multiple-choice, got 'pos'"),
    (dict(max_length=4), "max_length must be an integer >= 8, got 4"),
    (dict(precision="fp8"), "precision must be one of auto, fp32, bf16, fp16, got 'fp8'"),
    (dict(resume=True, overwrite=True), "--resume and --overwrite contradict each other"),
], ids=["epochs", "seed", "lr", "task", "max_length", "precision", "resume-and-overwrite"])
def test_a_bad_setting_is_refused_by_name(settings, message):
    with pytest.raises(BertforgeError, match=message):
        FinetuneConfig(**{**PATHS, **settings}).validate()


def test_a_config_file_that_cannot_be_read_is_named(tmp_path):
    path = tmp_path / "config.json"
    for content, message in [(json.dumps({**PATHS, "learning_rate": 1e-4}), "unknown setting(s) learning_rate"),
                             (json.dumps({"task": "ner"}), "missing"), ("{", "not valid JSON"),
                             ("[]", "expected a JSON object")]:
        path.write_text(content)
        with pytest.raises(BertforgeError, match=re.escape(f"{path}: ") + ".*" + re.escape(message)):
            FinetuneConfig.from_json(path)
    with pytest.raises(BertforgeError, match="no such file"):
        FinetuneConfig.from_json(tmp_path / "none.json")
