"""Crash safety of pretraining: `bertforge pretrain` runs as a subprocess and is SIGKILLed at random moments (some
timed to land inside a checkpoint write), then resumed with `--resume`, again and again until it finishes.

After every kill the newest complete checkpoint must load (weights, config, optimizer, schedule, RNGs, data
position); at the end the final weights must be bitwise equal to those of a run that was never interrupted, and
the metrics log the same, and the last launch must say it resumed from the newest checkpoint.

Only a kill that lands when at least one complete checkpoint is on disk counts as survived: a kill before the
first checkpoint leaves nothing to resume from (the run starts again from step 0, which proves nothing about
resuming), so those are counted and reported apart, and the campaign goes on until enough kills found a checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge import BertForPreTraining
from bertforge.model.checkpoint import load_pretrained
from bertforge.core.state import load_state
from tests.helpers import make_run_inputs
from tests.reliability.rel_helpers import Reference, Subject, bertforge_cmd, kill_campaign, run_reference

STEPS, SAVE_EVERY = 20, 2


def pretrain_argv(inputs: tuple[Path, Path, Path], out: Path, resume: bool) -> list[str]:
    corpus, tok, config = inputs
    argv = bertforge_cmd(
        "pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config), "--out", str(out),
        "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--keep-checkpoints", "3", "--log-every", "2",
        "--batch-size", "4", "--max-length", "32", "--lr", "1e-3", "--warmup-steps", "2", "--no-progress",
        "--device", "cpu",
    )
    return argv + ["--resume"] if resume else argv


def verify_checkpoint(path: Path, step: int) -> None:
    """Everything a resume reads, read the way it reads it."""
    trainer = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    assert trainer["step"] == step, (path, trainer)
    load_pretrained(BertForPreTraining, path)  # config.json + model.safetensors, shapes and finiteness checked
    for name in ("optimizer", "scheduler", "rng", "data"):
        load_state(path, name)


@pytest.fixture(scope="module")
def subject(tmp_path_factory) -> Subject:
    inputs = make_run_inputs(tmp_path_factory.mktemp("crash_inputs"))
    return Subject(lambda out, resume: pretrain_argv(inputs, out, resume), "run_config.json", verify_checkpoint)


@pytest.fixture(scope="module")
def reference(subject, tmp_path_factory) -> Reference:
    """The same run, never interrupted."""
    return run_reference(subject, tmp_path_factory.mktemp("reference") / "run")


def test_sigkill_and_resume_fast(subject, reference, tmp_path):
    tally = kill_campaign(subject, reference, tmp_path, kills=3, seed=8, per_episode=3)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 3


@pytest.mark.slow
def test_sigkill_and_resume_50_kills(subject, reference, tmp_path):
    tally = kill_campaign(subject, reference, tmp_path, kills=50, seed=88, per_episode=7)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 50
    assert tally.inside_save >= 5, "too few kills landed inside a checkpoint write to say anything about it"


# ------------------------------------------------------------------------- the families of this round: the same campaign
FAMILY_PRESETS = {"modernbert": "modernbert-tiny", "deberta": "deberta-v3-tiny"}  # tokenizer kind -> preset


def verify_any_checkpoint(path: Path, step: int) -> None:
    """What a resume reads, for a model of any class (ModernBERT's MLM, DeBERTa-v3's generator + discriminator)."""
    from safetensors.torch import load_file

    trainer = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    assert trainer["step"] == step, (path, trainer)
    assert all(t.isfinite().all() for t in load_file(path / "model.safetensors").values())
    for name in ("optimizer", "scheduler", "rng", "data"):
        load_state(path, name)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FAMILY_PRESETS))
def test_sigkill_and_resume_new_families(kind, tmp_path_factory, tmp_path):
    """ModernBERT (whole-document packing, WSD) and DeBERTa-v3 (replaced-token detection: two networks, the
    generator's samples) survive SIGKILLs at random moments and end bitwise equal to an uninterrupted run (#34)."""
    from bertforge.tokenizer import Tokenizer

    corpus, _, _ = make_run_inputs(tmp_path_factory.mktemp(f"{kind}_inputs"))
    tok = corpus.parent / f"tok-{kind}"
    Tokenizer.train([str(corpus)], vocab_size=300, show_progress=False, kind=kind).save_pretrained(tok)

    def argv(out: Path, resume: bool) -> list[str]:
        return bertforge_cmd(
            "pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", FAMILY_PRESETS[kind],
            "--out", str(out), "--max-steps", "12", "--save-every", "2", "--keep-checkpoints", "3", "--log-every", "2",
            "--batch-size", "4", "--max-length", "32", "--lr", "1e-3", "--warmup-steps", "2", "--no-progress",
            "--device", "cpu", *(["--resume"] if resume else []))

    subject = Subject(argv, "run_config.json", verify_any_checkpoint)
    reference = run_reference(subject, tmp_path / "reference")
    (tmp_path / "killed").mkdir()
    tally = kill_campaign(subject, reference, tmp_path / "killed", kills=4, seed=11, per_episode=3)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 4
