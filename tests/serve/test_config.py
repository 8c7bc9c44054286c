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
                                         ("max_body_bytes", 1.5), ("max_connections", 0), ("max_input_chars", 0)])
def test_limits_must_be_positive_integers(field, value):
    with pytest.raises(BertforgeError, match=f"{field} must be a positive integer"):
        ServeConfig(model="m", **{field: value})


def test_the_task_must_be_one_it_knows():
    with pytest.raises(BertforgeError, match="task must be one of auto, embed, classify"):
        ServeConfig(model="m", task="generate")


@pytest.mark.parametrize("field,value", [("head_timeout", 0), ("body_timeout", float("nan")), ("head_timeout", "5")])
def test_timeouts_must_be_positive_seconds(field, value):
    with pytest.raises(BertforgeError, match=f"{field} must be a positive number of seconds"):
        ServeConfig(model="m", **{field: value})


def test_the_limits_of_a_client_are_command_line_options_declared_once(monkeypatch):
    """`bertforge serve --head-timeout ...`: the options come from ServeConfig's declarations (their defaults too)."""
    import argparse

    import bertforge.serve
    from bertforge.commands import serve

    seen = []
    monkeypatch.setattr(bertforge.serve, "run_server", lambda config, **kwargs: seen.append(config) or 0)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args(["--model", "m", "--head-timeout", "2.5", "--max-connections", "7"])) == 0
    (config,) = seen
    assert (config.head_timeout, config.max_connections, config.body_timeout, config.max_input_chars) == (
        2.5, 7, 30.0, None)
