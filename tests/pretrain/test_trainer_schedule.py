"""Pretraining schedules that cannot silently misfire: --warmup-ratio, a warmup not shorter than the run cut with a
warning, --decay wsd with --decay-ratio, contradicting schedule options refused."""

from __future__ import annotations

import json
import logging

import pytest

from bertforge import BertforgeError
from bertforge.pretrain.trainer import Pretrainer, pretrain
from tests.helpers import tiny_run_args

# corpus_and_tokenizer, the tiny corpus, tokenizer and config.json: a fixture of tests/conftest.py


def logged_lrs(out) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def test_default_warmup_longer_than_the_run_is_cut_to_a_tenth_with_a_warning(corpus_and_tokenizer, tmp_path, caplog):
    """The issue's case: --max-steps 60 with the default 100 warmup steps never reached the peak; now the warmup is 6
    steps, and the warning says what and why."""
    caplog.set_level(logging.WARNING)
    trainer = Pretrainer(tiny_run_args(corpus_and_tokenizer, tmp_path / "run", max_steps=60))
    assert "--warmup-steps 100 is not shorter than --max-steps 60" in caplog.text
    assert "warming up over 6 steps" in caplog.text
    factor = trainer.scheduler.lr_lambdas[0]
    assert [factor(t) for t in range(8)] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0, 1.0, 53 / 54])


def test_warmup_equal_to_the_run_is_cut_too(corpus_and_tokenizer, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    trainer = Pretrainer(tiny_run_args(corpus_and_tokenizer, tmp_path / "run", max_steps=20, warmup_steps=20))
    assert "--warmup-steps 20 is not shorter than --max-steps 20" in caplog.text
    assert trainer.scheduler.lr_lambdas[0](1) == 1.0  # warmup 2: the peak at the second step
    caplog.clear()
    Pretrainer(tiny_run_args(corpus_and_tokenizer, tmp_path / "ok", max_steps=20, warmup_steps=19))
    assert "not shorter" not in caplog.text  # a warmup shorter than the run is used as given


def test_warmup_ratio_sets_the_warmup_from_max_steps(corpus_and_tokenizer, tmp_path):
    peak, out = 1e-3, tmp_path / "run"
    pretrain(tiny_run_args(corpus_and_tokenizer, out, max_steps=10, warmup_ratio=0.3, lr=peak, log_every=1,
                           save_every=10, nsp=False))
    lrs = logged_lrs(out)  # warmup 3 steps: peak / 3, 2 peak / 3, peak; then linear decay over the remaining 7
    assert [lrs[s] for s in (1, 2, 3, 4, 5)] == pytest.approx([peak / 3, 2 * peak / 3, peak, peak, peak * 6 / 7])


def test_wsd_run_keeps_the_peak_then_decays_over_the_last_fraction(corpus_and_tokenizer, tmp_path):
    from bertforge.cli import main

    corpus, tok, config = corpus_and_tokenizer
    out = tmp_path / "run"
    assert main(["pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config), "--out", str(out),
                 "--max-steps", "8", "--batch-size", "4", "--max-length", "32", "--no-progress", "--device", "cpu",
                 "--lr", "0.001", "--warmup-steps", "2", "--decay", "wsd", "--decay-ratio", "0.5", "--log-every", "1"]) == 0
    lrs = logged_lrs(out)  # decay over the last 4 steps (t = 4..7): 1, 3/4, 1/2, 1/4 of the peak
    assert [lrs[s] / 1e-3 for s in range(1, 9)] == pytest.approx([0.5, 1, 1, 1, 1, 0.75, 0.5, 0.25])


@pytest.mark.parametrize("change, message", [
    (dict(warmup_ratio=0.1, warmup_steps=50), "--warmup-ratio contradicts --warmup-steps"),
    (dict(warmup_ratio=1.0), "--warmup-ratio must be in"),
    (dict(decay_ratio=0.3), "--decay-ratio applies to --decay wsd or wsd-sqrt only"),
    (dict(decay="wsd", decay_ratio=0.0), "--decay-ratio must be in"),
])
def test_bad_schedule_settings_are_refused(corpus_and_tokenizer, tmp_path, change, message):
    with pytest.raises(BertforgeError, match=message):
        pretrain(tiny_run_args(corpus_and_tokenizer, tmp_path / "run", **change))
    assert not (tmp_path / "run").exists()
