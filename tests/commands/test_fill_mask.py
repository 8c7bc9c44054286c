"""`bertforge fill-mask` (`bertforge.commands.fill_mask`): the fill-mask pipeline's predictions for each [MASK], as a
table or as JSON lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertforge
from bertforge import BertForMaskedLM
from bertforge.cli import main
from tests.helpers import SPECIALS, WORDS, tiny_config, write_uncased_tokenizer

TEXTS = ["river stone [MASK] light", "[MASK] window [MASK]"]  # one mask, then two


@pytest.fixture(scope="module")
def mlm_dir(tmp_path_factory) -> Path:
    """A tiny random BertForMaskedLM with its tokenizer."""
    vocab = [*SPECIALS, *WORDS]
    directory = write_uncased_tokenizer(tmp_path_factory.mktemp("mlm"), vocab)
    torch.manual_seed(0)
    BertForMaskedLM(tiny_config(vocab_size=len(vocab))).save_pretrained(directory)
    return directory


def test_json_lines_hold_the_pipelines_predictions_for_each_mask(mlm_dir, capsys):
    assert main(["fill-mask", "--model", str(mlm_dir), *TEXTS, "--top-k", "3", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = bertforge.pipeline("fill-mask", model=mlm_dir, top_k=3)(TEXTS)
    assert [line["text"] for line in lines] == TEXTS
    assert lines[0]["predictions"] == [expected[0]]  # one mask: one list of predictions
    assert lines[1]["predictions"] == expected[1] and len(expected[1]) == 2  # two masks: a list each
    assert all(len(predictions) == 3 for line in lines for predictions in line["predictions"])


def test_the_table_lists_the_top_k_tokens_with_their_scores(mlm_dir, capsys):
    assert main(["fill-mask", "--model", str(mlm_dir), TEXTS[0], "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    (expected,) = bertforge.pipeline("fill-mask", model=mlm_dir, top_k=2)([TEXTS[0]])
    assert lines[0] == TEXTS[0] and len(lines) == 3  # the text, then a line per prediction
    for line, prediction in zip(lines[1:], expected):
        score, token = line.split()[:2]
        assert (score, token) == (f"{prediction['score']:.4f}", prediction["token_str"])
        assert line.endswith(prediction["sequence"])


def test_cli_fill_mask(cognition_dir, minilm_dir, capsys):
    assert main(["fill-mask", "--model", str(cognition_dir), "The capital of France is [MASK].", "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    assert "city" in out and "the capital of france is city." in out
    assert main(["fill-mask", "--model", str(cognition_dir), "--json", "[MASK] and [MASK]"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert len(record["predictions"]) == 2 and len(record["predictions"][0]) == 5
    assert main(["fill-mask", "--model", str(minilm_dir), "a [MASK]"]) == 2
    err = capsys.readouterr().err
    assert "has no MLM head (cls.predictions.*" in err and "Traceback" not in err
    assert main(["fill-mask", "--model", str(cognition_dir), "no mask"]) == 2
    assert "has no [MASK] token" in capsys.readouterr().err
