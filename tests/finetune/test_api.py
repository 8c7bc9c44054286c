"""`bertforge.finetune.api`: the Python API `finetune(...)` takes its settings as keywords and checks them."""

from __future__ import annotations

import pytest

from bertforge import BertforgeError
from bertforge.finetune import api, finetune

# tiny_model, the tiny BERT of the fine-tuning tests: a fixture of tests/finetune/conftest.py


def test_api_takes_both_controls_and_refuses_bad_values(tmp_path, tiny_model, monkeypatch):
    seen = []
    monkeypatch.setattr(api, "_finetune", lambda cfg, *where: seen.append(cfg) or {})
    paths = dict(task="classification", model=str(tiny_model), train="t", dev="d", out=str(tmp_path / "o"))
    finetune(**paths, freeze_backbone=True, layer_lr_decay=0.9)
    assert (seen[0].freeze_backbone, seen[0].layer_lr_decay) == (True, 0.9)
    with pytest.raises(BertforgeError, match="layer_lr_decay must be a number in"):
        finetune(**paths, layer_lr_decay=0)
    with pytest.raises(BertforgeError, match="freeze_backbone must be true or false"):
        finetune(**paths, freeze_backbone="yes")
