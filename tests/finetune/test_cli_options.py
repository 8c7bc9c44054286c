"""`bertforge.finetune.cli_options`: the options of finetune, evaluate and predict, generated from `DataOptions` and
`FinetuneConfig`, each None unless given (what the options change in a run: tests/commands/test_finetune.py,
test_evaluate.py, test_predict.py)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from bertforge.finetune.cli_options import DATA_OPTIONS, add_data_arguments, add_task_arguments, given
from bertforge.finetune.config import DataOptions


def parser(required: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_task_arguments(p, required=required)
    add_data_arguments(p)
    return p


def test_data_options_are_the_fields_of_data_options_and_none_unless_given():
    assert set(DATA_OPTIONS) == {f.name for f in dataclasses.fields(DataOptions)}
    args = parser().parse_args(["--task", "ner", "--model", "m"])
    assert (args.task, args.model) == ("ner", "m")
    assert given(args, DATA_OPTIONS) == {}  # nothing given: each default stays the one DataOptions declares
    args = parser().parse_args(["--task", "qa", "--model", "m", "--max-length", "48", "--doc-stride", "16",
                                "--text-pair-column", "b", "--no-header", "--no-progress"])
    assert given(args, DATA_OPTIONS) == {"max_length": 48, "doc_stride": 16, "text_pair_column": "b",
                                         "no_header": True, "progress": False}
    options = DataOptions(**given(args, DATA_OPTIONS))
    options.validate()
    assert (options.max_length, options.n_best, options.label_column) == (48, 20, "label")


def test_task_and_model_are_required_and_the_task_is_one_of_the_three(capsys):
    for argv in (["--model", "m"], ["--task", "ner"], ["--task", "pos", "--model", "m"]):
        with pytest.raises(SystemExit):
            parser().parse_args(argv)
    err = capsys.readouterr().err
    assert "--task" in err and "--model" in err and "'pos'" in err
    assert parser(required=False).parse_args([]).task is None  # finetune: they may come from --config
