"""Tests of `bertforge.serve.config`: `ServeConfig` travels as JSON (to the worker processes of `--workers N`) and
refuses what it cannot serve with."""

from __future__ import annotations

import pytest

from bertforge import BertforgeError
from bertforge.serve import ServeConfig


def test_a_config_reads_back_from_its_json():
    config = ServeConfig(model="m", task="classify", model_name="name", max_queue=3, auto_truncate=True,
                         max_length=32, num_threads=2, quantize="int8")
    assert ServeConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("field,value", [("max_batch_tokens", 0), ("max_queue", -1), ("max_client_batch_size", True),
                                         ("max_body_bytes", 1.5)])
def test_limits_must_be_positive_integers(field, value):
    with pytest.raises(BertforgeError, match=f"{field} must be a positive integer"):
        ServeConfig(model="m", **{field: value})


def test_the_task_must_be_one_it_knows():
    with pytest.raises(BertforgeError, match="task must be one of auto, embed, classify"):
        ServeConfig(model="m", task="generate")
