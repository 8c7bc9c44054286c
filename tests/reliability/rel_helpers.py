"""Shared pieces of the reliability tests: a tiny corpus, tokenizer, config and model, and a one-thread guard.

The tests run on small shared CPU machines: every subprocess gets OMP_NUM_THREADS=1 (two busy cores and an
oversubscribed OpenMP pool make a 20-step run take 20 s instead of 2 s), and in-process training uses one thread
through `one_torch_thread()`, which restores the previous setting.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.helpers import TINY_CONFIG


def make_model_dir(root: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    """A tiny BertForPreTraining in Hugging Face layout (config.json + model.safetensors [+ tokenizer files])."""
    from bertforge import BertConfig, BertForPreTraining
    from bertforge.tokenizer import Tokenizer

    torch.manual_seed(seed)
    model = BertForPreTraining(BertConfig(**TINY_CONFIG))
    model.save_pretrained(root)
    if tokenizer_dir is not None:
        Tokenizer.from_pretrained(tokenizer_dir).save_pretrained(root)
    return root


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.pop("PYTHONWARNINGS", None)
    return env


def bertforge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertforge", *args]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def tensors_differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in any bit (NaN payloads and the sign of zero included), or are on one side only."""
    differ = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(_bits(x), _bits(y)):
            differ.append(key)
    return differ


def stray_temporaries(root: Path) -> list[Path]:
    """Temporary files and directories the atomic writers leave only when something went wrong."""
    return sorted(p for p in root.rglob(".*") if p.name.endswith(".tmp") or ".old-" in p.name)


FIGURES: list[str] = []  # repeated in the terminal summary by conftest.py


def report(line: str) -> None:
    """Print a figure now (seen with -s) and keep it for the end-of-session summary (seen without)."""
    print(line)
    FIGURES.append(line)


# ---------------------------------------------------------------------------------------------- kill campaigns
# A run of a training command as a subprocess, SIGKILLed at random moments (some timed to land inside a checkpoint
# write) and relaunched with --resume until it finishes; then compared with the same run never interrupted.
# Pretraining (test_rel_crash.py) and fine-tuning (test_rel_finetune_crash.py) are its subjects.

LAUNCH_TIMEOUT = 300  # seconds for one launch on a busy 2-core machine


@dataclasses.dataclass
class Subject:
    """What a campaign kills: `argv(out, resume)` the command line of a launch; `marker` the file by which a launch
    has recorded its run in OUT (before it, --resume rightly refuses: there is no run); `verify(path, step)` reads a
    checkpoint the way a resume reads it."""

    argv: Callable[[Path, bool], list[str]]
    marker: str
    verify: Callable[[Path, int], None]


@dataclasses.dataclass
class Reference:
    out: Path
    seconds: float
    weights: dict
    metrics: list[dict]


def metrics_rows(out: Path) -> list[dict]:
    """OUT/metrics.jsonl without its timings (tokens_per_s), which no two runs share."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]


def run_reference(subject: Subject, out: Path) -> Reference:
    """The run, never interrupted."""
    started = time.perf_counter()
    proc = subprocess.run(subject.argv(out, False), env=subprocess_env(), capture_output=True, text=True,
                          timeout=LAUNCH_TIMEOUT)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Reference(out, seconds, load_file(str(out / "model" / "model.safetensors")), metrics_rows(out))


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
    from bertforge.training.run_dir import CHECKPOINT_RE

    seen = checkpoint_entries(out)  # a killed launch's leftovers are not news
    started = time.monotonic()
    hits = 0
    while proc.poll() is None:
        if time.monotonic() - started > LAUNCH_TIMEOUT:
            proc.kill()
            pytest.fail(f"launch hung for {LAUNCH_TIMEOUT}s")
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


def killed_launch(subject: Subject, proc: subprocess.Popen, out: Path, reference: Reference, rng: random.Random,
                  tally: Tally) -> bool:
    """Kill `proc` at a drawn moment and check the newest checkpoint it left; False if it finished first."""
    from bertforge.training.run_dir import list_checkpoints

    plan = draw_plan(rng, reference.seconds)
    if not wait_and_kill(proc, plan, out):
        return False
    tally.tried += 1
    tally.kinds[plan.kind] += 1
    if any(name.startswith(".step-") for name in checkpoint_entries(out)):
        tally.inside_save += 1
    found = list_checkpoints(out)
    if not found:
        tally.before_checkpoint += 1
        return True
    tally.with_checkpoint += 1
    try:
        subject.verify(found[-1][1], found[-1][0])
        tally.survived += 1
    except Exception as err:  # recorded, asserted on by the test with the others
        tally.failures.append(f"after a {plan} kill: {type(err).__name__}: {err}")
    return True


def episode(subject: Subject, out: Path, reference: Reference, kills: int, rng: random.Random, tally: Tally) -> None:
    """One run from scratch to the end, killed up to `kills` times; then compared with the reference."""
    from bertforge.training.run_dir import list_checkpoints

    tally.episodes += 1
    launches, planned = 0, kills
    log = out.parent / f"{out.name}.stderr"
    while True:
        launches += 1
        assert launches <= planned + 1  # each launch is killed once at most, or runs to the end
        at_start = list_checkpoints(out)  # what a resumed launch must resume from
        # a launch killed before it recorded its settings left no run: --resume would (rightly) refuse it
        resume = launches > 1 and (out / subject.marker).is_file()
        with open(log, "w") as err:
            proc = subprocess.Popen(subject.argv(out, resume), env=subprocess_env(), stdout=subprocess.DEVNULL,
                                    stderr=err)
        tally.launches += 1
        if kills > 0 and killed_launch(subject, proc, out, reference, rng, tally):
            kills -= 1
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


def kill_campaign(subject: Subject, reference: Reference, root: Path, kills: int, seed: int, per_episode: int) -> Tally:
    """Episodes until `kills` kills landed with a checkpoint on disk (or 4 x `kills` were tried); one figure
    reported."""
    rng, tally = random.Random(seed), Tally()
    started = time.perf_counter()
    while tally.with_checkpoint < kills and tally.tried < 4 * kills:
        episode(subject, root / f"run{tally.episodes}", reference, min(per_episode, kills - tally.with_checkpoint),
                rng, tally)
    seconds = time.perf_counter() - started
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(tally.kinds.items()))
    command = subject.argv(root, False)[3]
    report(f"{command}: kills survived {tally.survived} / {tally.with_checkpoint} with a checkpoint on disk (and "
           f"{tally.before_checkpoint} more before the first checkpoint, not counted; {kinds}; {tally.inside_save} "
           f"landed inside a checkpoint write; {tally.launches} launches, {tally.episodes} run(s) ending bitwise equal "
           f"to the uninterrupted run: {tally.episodes - sum('final weights' in f for f in tally.failures)}; "
           f"{seconds:.0f}s)")
    return tally
