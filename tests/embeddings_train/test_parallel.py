"""Sentence-embedding training over two processes (`torchrun`, gloo on the CPU, one thread each) against one
process: each rank embeds its share of the global batch and the in-batch-negatives loss sees the whole batch, so
every step's loss equals the one-process run's at the same global batch, with and without gradient caching; a
two-process run stopped after a step and resumed ends bitwise as the uninterrupted two-process run; DDP all-reduces
the gradients once a step (counted by a communication hook), gradient caching's mini-batches included.

Measured on this project's shared 2-core machine (global batch 8, mnrl, no dropout): per-step losses within
1.2e-6 of one process (1.7e-6 with --mini-batch-size 6), final weights within 6.6e-7 (7.1e-7); the bars below are
1e-5 for both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertforge.embeddings_train import train_embeddings
from bertforge.embeddings_train.parallel import shares
from bertforge.training.run_dir import list_checkpoints
from tests.embeddings_train.embeddings_train_helpers import DEV_TEMPLATES, TRAIN_TEMPLATES, make_model, pairs, write_tsv

WORKER = Path(__file__).parent / "parallel_worker.py"
# 32 pairs in global batches of 8: 4 optimizer steps; a row of metrics.jsonl after each
RUN = dict(epochs=1, batch_size=8, lr=1e-3, log_every=1, max_length=16, seed=3, device="cpu", progress=False)


def test_shares_are_contiguous_near_equal_and_in_order():
    assert shares(8, 2) == [4, 4] and shares(7, 2) == [4, 3] and shares(5, 3) == [2, 2, 1] and shares(2, 2) == [1, 1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(a tiny model without dropout, one with it, 32 training pairs)."""
    root = tmp_path_factory.mktemp("parallel")
    plain = make_model(root / "no_dropout", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return plain, make_model(root / "dropout"), write_tsv(root / "train.tsv", pairs(TRAIN_TEMPLATES)[:32])


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def arguments(model: Path, train: Path, out: Path, **settings) -> list[str]:
    args = ["train-embeddings", "--model", str(model), "--train", str(train), "--out", str(out)]
    for name, value in {**RUN, **settings}.items():  # progress=False: --no-progress; resume=True: --resume
        flag = "--no-progress" if name == "progress" else "--" + name.replace("_", "-")
        args += [flag] if isinstance(value, bool) else [flag, str(value)]
    return args


def two_processes(args: list[str], stop_after: int | None = None,
                  count_syncs: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", **({"STOP_AFTER_STEP": str(stop_after)} if stop_after else {}),
               **({"COUNT_GRAD_SYNCS": str(count_syncs)} if count_syncs else {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(WORKER), *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("the two-process run did not finish in 300 s (a rank left waiting in a collective?)")


def train_losses(out: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["type"] == "train"]


def eval_rows(out: Path) -> list[dict[str, float]]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if "@" in k} for r in rows if r["type"] == "eval"]  # mrr@10, recall@k...


def weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model.safetensors"))


def largest_gap(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


# (settings, optimizer steps): batches of 5 are shared 3 + 2, and with --mini-batch-size 4 the ranks run two and one
# mini-batches (6 and 4 texts), the last batch (2 pairs) one each
CASES = [({"dev": "DEV"}, 4), pytest.param({"mini_batch_size": 6}, 4, marks=pytest.mark.slow),
         pytest.param({"batch_size": 5, "mini_batch_size": 4, "symmetric": True, "matryoshka_dims": "32,16"}, 7,
                      marks=pytest.mark.slow)]


@pytest.mark.parametrize(("settings", "steps"), CASES,
                         ids=["plain", "cached", "uneven-symmetric-matryoshka"])
def test_two_processes_equal_one_at_the_same_global_batch(inputs, tmp_path, one_thread, settings, steps):
    model, _, train = inputs
    if settings.get("dev") == "DEV":  # a dev set scored by rank 0 alone, its metrics handed to every rank
        settings = dict(settings, dev=str(write_tsv(tmp_path / "dev.tsv", pairs(DEV_TEMPLATES))))
    train_embeddings(model=str(model), train=str(train), out=str(tmp_path / "one"), **{**RUN, **settings})
    done = two_processes(arguments(model, train, tmp_path / "two", **settings), count_syncs=tmp_path / "syncs")
    assert done.returncode == 0, done.stderr[-3000:]
    # the tiny model's gradients fill one DDP bucket: one all-reduce a step on each rank, however many mini-batches
    # (--mini-batch-size) the step backpropagates
    assert [int((tmp_path / f"syncs.{rank}").read_text()) for rank in (0, 1)] == [steps, steps]
    assert done.stdout.count(f'"train_steps": {steps}') == 1  # the summary, printed once (by rank 0)
    one, two = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert len(one) == len(two) == steps
    assert max(abs(a - b) for a, b in zip(one, two)) < 1e-5, (one, two)
    assert largest_gap(weights(tmp_path / "one"), weights(tmp_path / "two")) < 1e-5
    assert [p.name for p in (tmp_path / "two" / "checkpoints").iterdir()] == [f"step-{steps}"]
    if "dev" in settings:  # before training and after the epoch, the same figures as one process
        one, two = (eval_rows(tmp_path / run) for run in ("one", "two"))
        assert len(one) == len(two) == 2 and all(abs(a[k] - b[k]) < 1e-5 for a, b in zip(one, two) for k in a)


@pytest.mark.slow
def test_a_rank_without_examples_is_refused_on_every_rank(inputs, tmp_path):
    """31 pairs in batches of 10: the last batch holds one pair, which two processes cannot share; both refuse
    before training (no rank left waiting)."""
    model, _, _ = inputs
    train = write_tsv(tmp_path / "odd.tsv", pairs(TRAIN_TEMPLATES)[:31])
    done = two_processes(arguments(model, train, tmp_path / "two", batch_size=10))
    assert done.returncode != 0 and "cannot be shared by 2 processes" in done.stderr
    assert not (tmp_path / "two").exists()


@pytest.mark.slow
def test_a_two_process_run_stopped_and_resumed_ends_as_the_run_never_stopped(inputs, tmp_path):
    """Dropout on (each rank its own masks, restored from the checkpoint): stopped right after step 3, between
    the checkpoints of steps 2 and 4, and resumed from step 2; the weights and rows equal bit for bit."""
    _, model, train = inputs
    reference = two_processes(arguments(model, train, tmp_path / "reference", save_every=2))
    assert reference.returncode == 0, reference.stderr[-3000:]
    stopped = two_processes(arguments(model, train, tmp_path / "run", save_every=2), stop_after=3)
    assert stopped.returncode != 0 and [s for s, _ in list_checkpoints(tmp_path / "run")] == [2]
    resumed = two_processes(arguments(model, train, tmp_path / "run", save_every=2, resume=True))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = weights(tmp_path / "reference"), weights(tmp_path / "run")
    assert a.keys() == b.keys() and all(torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)) for k in a)
    assert (tmp_path / "reference" / "metrics.jsonl").read_text() == (tmp_path / "run" / "metrics.jsonl").read_text()
    assert largest_gap(a, load_file(str(model / "model.safetensors"))) > 1e-4  # it trained
