"""`bertforge.pretrain.args`: the settings of a pretraining run are a value: validated once, never written after
(the family's recipe is a new value; the run's length under a time budget lives in `time_budget.RunLength`)."""

from __future__ import annotations

import dataclasses

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.model.config import BertConfig
from bertforge.pretrain.args import PretrainArgs, decided_by, refuse_contradictions
from bertforge.training.time_budget import PROVISIONAL_STEPS


def test_the_warmup_of_a_length_other_than_max_steps():
    a = PretrainArgs(max_steps=100, warmup_steps=20)
    assert a.warmup() == (20, None) and a.warmup(1000) == (20, None)
    used, note = a.warmup(15)  # a budget that fits 15 steps: the warmup is cut to a tenth of them
    assert used == 1 and "not shorter than --max-steps 15" in note
    assert PretrainArgs(max_steps=100, warmup_ratio=0.1).warmup(50) == (5, None)


def test_a_budgeted_run_starts_provisional_and_its_settings_keep_max_steps():
    assert PretrainArgs(max_steps=70).first_length == 70
    budget = PretrainArgs(max_minutes=1.0)
    assert budget.first_length == PROVISIONAL_STEPS and budget.max_steps == 1000


def test_validation_and_the_family_recipe_leave_the_settings_as_they_are():
    a = PretrainArgs(config="roberta-tiny", max_minutes=2.0)
    before = dataclasses.asdict(a)
    a.validate()
    resolved = a.for_family(a.model_config())
    assert dataclasses.asdict(a) == before  # a new value, not a changed one
    assert resolved.objective == "mlm" and resolved.adam_beta2 == 0.98 and resolved is not a


def test_contradictions_are_refused_in_one_line():
    with pytest.raises(BertforgeError, match="--max-minutes contradicts --max-steps"):
        refuse_contradictions({"max_minutes", "max_steps"})
    assert decided_by({"init_from"}) >= {"config", "tokenizer", "vocab_size"}
    assert BertConfig  # the settings read configs through the model layer


def test_a_value_outside_an_options_choices_is_refused_from_python_too():
    """The Python API gets the command line's choices check: masking="whole_word" (whole words are
    whole_word_mask=True) is refused before anything runs, naming the field and the choices."""
    from bertforge import BertforgeError
    from bertforge.pretrain.args import PretrainArgs
    with pytest.raises(BertforgeError, match="masking must be one of auto, token, ngram, got 'whole_word'"):
        PretrainArgs(masking="whole_word").validate()


def test_run_settings_resolve_defaults_as_the_command_does(monkeypatch):
    """One resolution of defaults: `pretrain(**settings)` from Python and `bertforge pretrain` on the command line
    make the same PretrainArgs of the same settings (with no corpus, the demo's defaults: a deberta-v3-tiny run
    from Python had trained at PretrainArgs' lr 1e-4 where the command used the demo's 2e-3, and learned far less)."""
    from bertforge.cli import main
    from bertforge.pretrain import trainer
    from bertforge.pretrain.args import DEMO, run_settings

    seen: list[PretrainArgs] = []
    monkeypatch.setattr(trainer.Pretrainer, "__init__", lambda self, args: seen.append(args) or None)
    monkeypatch.setattr(trainer.Pretrainer, "run", lambda self: None)
    monkeypatch.setattr(trainer.Pretrainer, "finish", lambda self: None)  # both reach the trainer with their settings
    trainer.pretrain(config="deberta-v3-tiny", max_steps=800, max_length=64)
    assert main(["pretrain", "--config", "deberta-v3-tiny", "--max-steps", "800", "--max-length", "64"]) == 0
    from_python, from_cli = seen
    assert from_python == from_cli
    assert (from_python.lr, from_python.vocab_size, from_python.warmup_steps) == (DEMO["lr"], DEMO["vocab_size"], 100)
    assert from_python.max_steps == 800 and from_python.out == DEMO["out"]
    on_a_corpus = run_settings({"corpus": ["a.txt"], "config": "mini"})
    assert on_a_corpus == PretrainArgs(corpus=["a.txt"], config="mini")  # a corpus: PretrainArgs' own defaults


def test_run_settings_refuse_contradictions_and_unknown_settings():
    from bertforge.pretrain.args import run_settings
    from bertforge.pretrain.trainer import pretrain

    with pytest.raises(BertforgeError, match="--warmup-ratio contradicts --warmup-steps"):
        run_settings({"warmup_ratio": 0.1, "warmup_steps": 5})
    with pytest.raises(BertforgeError, match="bad pretraining settings: .*learning_rate"):
        run_settings({"learning_rate": 1e-3})
    with pytest.raises(BertforgeError, match="not both"):
        pretrain(PretrainArgs(), max_steps=3)
