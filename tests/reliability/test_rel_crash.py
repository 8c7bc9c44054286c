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

import dataclasses
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from safetensors.torch import load_file

from bertforge import BertForPreTraining
from bertforge.checkpoint import load_pretrained
from bertforge.pretrain import CHECKPOINT_RE, list_checkpoints
from bertforge.state import load_state
from rel_helpers import bertforge_cmd, make_run_inputs, report, subprocess_env, tensors_differ

STEPS, SAVE_EVERY = 20, 2
LAUNCH_TIMEOUT = 300  # seconds for one launch on a busy 2-core machine


def pretrain_argv(inputs: tuple[Path, Path, Path], out: Path, resume: bool) -> list[str]:
    corpus, tok, config = inputs
    argv = bertforge_cmd(
        "pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config), "--out", str(out),
        "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY), "--keep-last", "3", "--log-every", "2",
        "--batch-size", "4", "--seq-len", "32", "--lr", "1e-3", "--warmup-steps", "2", "--no-progress",
        "--device", "cpu",
    )
    return argv + ["--resume"] if resume else argv


def metrics_rows(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]


@dataclasses.dataclass
class Reference:
    out: Path
    seconds: float
    weights: dict
    metrics: list[dict]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_run_inputs(tmp_path_factory.mktemp("crash_inputs"))


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Reference:
    """The same run, never interrupted."""
    out = tmp_path_factory.mktemp("reference") / "run"
    started = time.perf_counter()
    proc = subprocess.run(pretrain_argv(inputs, out, resume=False), env=subprocess_env(), capture_output=True,
                          text=True, timeout=LAUNCH_TIMEOUT)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Reference(out, seconds, load_file(str(out / "model" / "model.safetensors")), metrics_rows(out))


# ---------------------------------------------------------------------------------------------- killing


@dataclasses.dataclass
class Plan:
    """When to kill: `random` after `delay` seconds; `mid-save` when the `nth` new temporary `.step-*` directory
    appears (+ `delay`); `after-save` when the `nth` new complete `step-N` appears (+ `delay`: pruning old
    checkpoints, the next steps, the metrics line)."""

    kind: str
    delay: float
    nth: int = 1


def draw_plan(rng: random.Random, launch_seconds: float) -> Plan:
    kind = rng.choice(["random", "mid-save", "after-save"])
    if kind == "random":
        return Plan(kind, delay=rng.uniform(0.25, 1.0) * launch_seconds)
    return Plan(kind, delay=rng.uniform(0.0, 0.06), nth=rng.randint(1, 3))


def checkpoint_entries(out: Path) -> set[str]:
    try:
        return set(os.listdir(out / "checkpoints"))
    except FileNotFoundError:
        return set()


def wait_and_kill(proc: subprocess.Popen, plan: Plan, out: Path) -> bool:
    """SIGKILL `proc` at the moment `plan` names; False if it finished by itself first."""
    seen = checkpoint_entries(out)  # a killed launch's leftovers are not news
    started = time.monotonic()
    hits = 0
    while proc.poll() is None:
        if time.monotonic() - started > LAUNCH_TIMEOUT:
            proc.kill()
            pytest.fail(f"pretraining launch hung for {LAUNCH_TIMEOUT}s")
        if plan.kind == "random":
            if time.monotonic() - started >= plan.delay:
                break
        else:
            now = checkpoint_entries(out)
            for name in now - seen:
                temporary = name.startswith(".step-")
                if (plan.kind == "mid-save" and temporary) or (plan.kind == "after-save" and CHECKPOINT_RE.match(name)):
                    hits += 1
            seen |= now
            if hits >= plan.nth:
                time.sleep(plan.delay)
                break
        time.sleep(0.001)
    else:
        return False
    os.kill(proc.pid, signal.SIGKILL)
    return proc.wait() == -signal.SIGKILL


def verify_checkpoint(path: Path, step: int) -> None:
    """Everything a resume reads, read the way it reads it."""
    trainer = json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
    assert trainer["step"] == step, (path, trainer)
    load_pretrained(BertForPreTraining, path)  # config.json + model.safetensors, shapes and finiteness checked
    for name in ("optimizer", "scheduler", "rng", "data"):
        load_state(path, name)


@dataclasses.dataclass
class Tally:
    tried: int = 0
    before_checkpoint: int = 0  # kills with no complete checkpoint on disk yet: not counted as survived
    with_checkpoint: int = 0
    survived: int = 0  # of the kills with a checkpoint on disk
    inside_save: int = 0
    launches: int = 0
    episodes: int = 0
    kinds: Counter = dataclasses.field(default_factory=Counter)
    failures: list[str] = dataclasses.field(default_factory=list)


def episode(inputs, out: Path, reference: Reference, kills: int, rng: random.Random, tally: Tally) -> None:
    """One run from scratch to the end, killed up to `kills` times; then compared with the reference."""
    tally.episodes += 1
    launches, planned = 0, kills
    log = out.parent / f"{out.name}.stderr"
    while True:
        launches += 1
        assert launches <= planned + 1  # each launch is killed once at most, or runs to the end
        at_start = list_checkpoints(out)  # what a resumed launch must resume from
        # a launch killed before it recorded its settings left no run: --resume would (rightly) refuse it
        resume = launches > 1 and (out / "run_config.json").is_file()
        with open(log, "w") as err:
            proc = subprocess.Popen(pretrain_argv(inputs, out, resume=resume), env=subprocess_env(),
                                    stdout=subprocess.DEVNULL, stderr=err)
        tally.launches += 1
        if kills > 0:
            plan = draw_plan(rng, reference.seconds)
            if wait_and_kill(proc, plan, out):
                kills -= 1
                tally.tried += 1
                tally.kinds[plan.kind] += 1
                if any(name.startswith(".step-") for name in checkpoint_entries(out)):
                    tally.inside_save += 1
                found = list_checkpoints(out)
                if not found:
                    tally.before_checkpoint += 1
                    continue
                tally.with_checkpoint += 1
                try:
                    verify_checkpoint(found[-1][1], found[-1][0])
                    tally.survived += 1
                except Exception as err:  # recorded, asserted on below with the others
                    tally.failures.append(f"after a {plan} kill: {type(err).__name__}: {err}")
                continue
        rc = proc.wait(timeout=LAUNCH_TIMEOUT)
        assert rc == 0, f"launch {launches} failed (rc {rc}):\n{log.read_text()[-3000:]}"
        if resume:
            said = log.read_text()
            expected = f"resumed from {at_start[-1][1]} (step {at_start[-1][0]})" if at_start else "no checkpoint in"
            if expected not in said:
                tally.failures.append(f"{out}: the last launch did not say {expected!r}:\n{said[-1500:]}")
        break
    differ = tensors_differ(reference.weights, load_file(str(out / "model" / "model.safetensors")))
    if differ:
        tally.failures.append(f"{out}: final weights differ from the uninterrupted run's in {differ[:5]}")
    if metrics_rows(out) != reference.metrics:
        tally.failures.append(f"{out}: metrics.jsonl differs from the uninterrupted run's")


def kill_campaign(inputs, reference: Reference, root: Path, kills: int, seed: int, per_episode: int) -> Tally:
    rng, tally = random.Random(seed), Tally()
    started = time.perf_counter()
    while tally.with_checkpoint < kills and tally.tried < 4 * kills:
        episode(inputs, root / f"run{tally.episodes}", reference, min(per_episode, kills - tally.with_checkpoint),
                rng, tally)
    seconds = time.perf_counter() - started
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(tally.kinds.items()))
    report(f"kills survived {tally.survived} / {tally.with_checkpoint} with a checkpoint on disk (and "
           f"{tally.before_checkpoint} more before the first checkpoint, not counted; {kinds}; {tally.inside_save} "
           f"landed inside a checkpoint write; {tally.launches} launches, {tally.episodes} run(s) ending bitwise equal "
           f"to the uninterrupted run: {tally.episodes - sum('final weights' in f for f in tally.failures)}; "
           f"{seconds:.0f}s)")
    return tally


def test_sigkill_and_resume_fast(inputs, reference, tmp_path):
    tally = kill_campaign(inputs, reference, tmp_path, kills=3, seed=8, per_episode=3)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 3


@pytest.mark.slow
def test_sigkill_and_resume_50_kills(inputs, reference, tmp_path):
    tally = kill_campaign(inputs, reference, tmp_path, kills=50, seed=88, per_episode=7)
    assert not tally.failures, "\n".join(tally.failures)
    assert tally.survived == tally.with_checkpoint >= 50
    assert tally.inside_save >= 5, "too few kills landed inside a checkpoint write to say anything about it"
