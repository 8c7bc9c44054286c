"""What careless or unlucky users do to a run directory and a training run (issue 17): an `--overwrite` that fails
loses nothing of the previous run, a second run into a directory in use is refused naming the first one's pid,
`--resume` of a directory that holds no run refuses, a diverging run stops with an error and never saves NaN
weights (and its metrics.jsonl stays strict JSON), an OSError is one line, a model that cannot fit is refused
before allocation, and a small corpus holding a 1 MB line no longer takes minutes.

The CLI cases run `bertforge.cli.main` in this process (the same code as the command, without a torch import per
case); the lock is tried against a real second process."""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from bertforge import cli
from bertforge.model.config import BertConfig
from bertforge.core.errors import BertforgeError
from bertforge.core.io import lock_run_directory, run_lock_path
from bertforge.model.memory import (
    MiB,
    activation_bytes_per_sequence,
    check_fits,
    estimate_training_memory,
    parameter_count,
)
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer
from bertforge.training.run_dir import list_checkpoints
from bertforge.training.step import TrainStep
from bertforge.training.log import MetricsLog
from tests.helpers import TINY_CONFIG, WORDS, make_corpus, make_run_inputs
from tests.reliability.rel_helpers import bertforge_cmd, one_torch_thread, report, subprocess_env


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return make_run_inputs(tmp_path_factory.mktemp("runs"))


def argv(inputs, out: Path, *extra: str, tokenizer: bool = True, steps: int = 2) -> list[str]:
    corpus, tok, config = inputs
    args = ["pretrain", "--corpus", str(corpus), "--config", str(config), "--out", str(out), "--max-steps", str(steps),
            "--batch-size", "4", "--max-length", "32", "--save-every", "2", "--log-every", "1", "--warmup-steps", "1",
            "--device", "cpu", "--no-progress"]
    if tokenizer:
        args += ["--tokenizer", str(tok)]
    else:
        args += ["--vocab-size", "120"]
    return args + list(extra)


def cli_run(args: list[str], capsys) -> tuple[int, str]:
    """`bertforge ARGS` in this process: (exit status, stderr)."""
    capsys.readouterr()
    with one_torch_thread():
        rc = cli.main(args)
    return rc, capsys.readouterr().err


def error_line(err: str) -> str:
    """The one error line of a refused command (its log lines before it are fine); no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1, err
    return lines[0]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` (the lock beside it is not under it) and its content's hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def previous_run(inputs, tmp_path_factory):
    """A finished run that trained its own vocabulary (OUT/tokenizer/): what a failing --overwrite must not lose."""
    out = tmp_path_factory.mktemp("previous") / "run"
    with one_torch_thread():
        assert cli.main(argv(inputs, out, tokenizer=False)) == 0
    assert (out / "tokenizer" / "tokenizer.json").is_file() and (out / "model" / "model.safetensors").is_file()
    return out


# ---------------------------------------------------------------------------------------------- 1. --overwrite
def huge_config(root: Path) -> Path:
    """The issue's config: each field allowed, ~1.5e11 parameters in all."""
    path = root / "huge.json"
    path.write_text(json.dumps(dict(hidden_size=16384, num_attention_heads=64, intermediate_size=65536,
                                    num_hidden_layers=48, vocab_size=120, max_position_embeddings=512)))
    return path


def test_a_failing_overwrite_loses_nothing_of_the_previous_run(inputs, previous_run, tmp_path, capsys):
    """Each way the new run can be wrong is refused in one line, and the previous run (its trained vocabulary
    included) is byte for byte what it was."""
    before = snapshot(previous_run)
    one_doc = tmp_path / "one.txt"
    one_doc.write_text("a single document .\nwith two sentences .\n")
    corpus, tok, config = inputs
    cases = {
        "one-document corpus with NSP": (argv((one_doc, tok, config), previous_run, "--overwrite", tokenizer=False),
                                         "has only 1 document"),
        "missing tokenizer": (argv(inputs, previous_run, "--overwrite", "--tokenizer", str(tmp_path / "nope")),
                              str(tmp_path / "nope")),
        "a model that cannot fit": (argv(inputs, previous_run, "--overwrite", "--config", str(huge_config(tmp_path))),
                                    "needs about"),
        "seq-len above the positions": (argv(inputs, previous_run, "--overwrite", "--max-length", "512"), "--max-length 512"),
    }
    for what, (args, expected) in cases.items():
        rc, err = cli_run(args, capsys)
        assert rc == 2, (what, err)
        assert expected in error_line(err), (what, err)
        assert snapshot(previous_run) == before, what
        assert not (previous_run / ".replaced-run").exists(), what
    report(f"--overwrite refused before any change: {len(cases)} / {len(cases)} failing new runs, the previous run "
           f"({len(before)} files, its trained vocabulary included) byte for byte intact")


def test_an_overwrite_failing_before_its_first_checkpoint_puts_the_previous_run_back(inputs, previous_run, capsys,
                                                                                      monkeypatch):
    before = snapshot(previous_run)
    real_step = Pretrainer.train_step

    def step(self):
        if self.step == 1:
            raise BertforgeError("simulated failure at step 2")
        return real_step(self)

    monkeypatch.setattr(Pretrainer, "train_step", step)
    rc, err = cli_run(argv(inputs, previous_run, "--overwrite", tokenizer=False), capsys)
    assert rc == 2 and "simulated failure" in error_line(err)
    assert snapshot(previous_run) == before
    assert not (previous_run / ".replaced-run").exists()


def test_an_overwrite_killed_before_its_first_checkpoint_is_undone_at_the_next_launch(inputs, previous_run, tmp_path,
                                                                                      capsys, caplog):
    """A SIGKILL leaves the previous run in OUT/.replaced-run/ beside the new run's first files: the next launch
    into OUT puts it back, so that --resume continues the previous run."""
    import shutil

    out = Path(shutil.copytree(previous_run, tmp_path / "run"))
    before = snapshot(out)
    aside = out / ".replaced-run"
    aside.mkdir()
    for name in ("checkpoints", "model", "tokenizer", "metrics.jsonl", "run_config.json", "tensorboard",
                 "training_curves.png"):
        if (out / name).exists():
            os.replace(out / name, aside / name)
    (out / "run_config.json").write_text("{}")  # what the killed new run had written
    (out / "tokenizer").mkdir()
    rc, err = cli_run(argv(inputs, out, "--resume", tokenizer=False, steps=2), capsys)
    assert rc == 0, err
    assert "back in place" in caplog.text and "resumed from" in caplog.text
    assert snapshot(out).keys() >= before.keys() and not aside.exists()
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (previous_run / "tokenizer" / "tokenizer.json").read_bytes()


def test_a_successful_overwrite_replaces_the_run(inputs, previous_run, tmp_path, capsys):
    import shutil

    out = Path(shutil.copytree(previous_run, tmp_path / "run"))
    (out / "notes.txt").write_text("mine")  # not the run's: left alone
    rc, err = cli_run(argv(inputs, out, "--overwrite", steps=4), capsys)
    assert rc == 0, err
    assert [s for s, _ in list_checkpoints(out)] == [2, 4]
    assert json.loads((out / "run_config.json").read_text())["max_steps"] == 4
    assert not (out / "tokenizer").exists()  # the new run uses --tokenizer: the old vocabulary went with the old run
    assert not (out / ".replaced-run").exists() and (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------------------------------------- 2. the lock
def test_a_second_run_into_a_directory_in_use_is_refused_naming_its_pid(inputs, tmp_path, capsys):
    """A real `bertforge pretrain` holds OUT; a second pretrain (--resume, --overwrite) and a finetune into it are
    refused naming its pid; once it is SIGKILLed, the kernel has dropped the lock and --resume goes ahead."""
    out = tmp_path / "run"
    lock = run_lock_path(out.resolve())
    first = subprocess.Popen(bertforge_cmd(*argv(inputs, out, steps=100_000)), env=subprocess_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (out / "run_config.json").is_file():
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline, "the first run never started"
            time.sleep(0.05)
        assert lock.read_text().split()[:2] == [str(first.pid), "pretrain"]
        refused = 0
        for extra in (["--resume"], ["--overwrite"]):
            rc, err = cli_run(argv(inputs, out, *extra, steps=100_000), capsys)
            line = error_line(err)
            assert rc == 2 and f"pid {first.pid}" in line and str(out) in line, err
            refused += 1
        from bertforge.finetune import finetune

        with pytest.raises(BertforgeError, match=f"pid {first.pid}"):
            finetune(task="classification", model=str(tmp_path / "m"), train=str(tmp_path / "t"),
                     dev=str(tmp_path / "d"), out=str(out), overwrite=True)
        refused += 1
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert lock.exists()  # a killed run leaves its lock file, but not its lock
    rc, err = cli_run(argv(inputs, out, "--resume", steps=2), capsys)
    assert rc == 0, err
    assert not lock.exists()  # released (and removed) at the end of the run
    report(f"run directory lock: {refused} / {refused} second runs into a directory in use refused naming the pid; "
           f"free again after a SIGKILL")


def test_the_lock_is_exclusive_between_processes_and_retaken_in_one(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from bertforge.core.io import lock_run_directory; "
        f"lock = lock_run_directory({str(out)!r}, 'finetune'); print('held', flush=True); time.sleep(120)")],
        env=subprocess_env(), stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(BertforgeError, match=f"in use by another bertforge finetune \\(pid {holder.pid}"):
            lock_run_directory(out)
    finally:
        holder.kill()
        holder.wait()
    first = lock_run_directory(out)  # free after the holder died
    second = lock_run_directory(out)  # the same process: an abandoned holder is taken over
    first.release()  # no longer the holder: changes nothing
    assert run_lock_path(out.resolve()).exists()
    second.release()
    assert not run_lock_path(out.resolve()).exists()


# ---------------------------------------------------------------------------------------------- 3. --resume
def test_resume_of_a_directory_holding_no_run_refuses(inputs, tmp_path, capsys):
    typo = tmp_path / "rnu"
    empty = tmp_path / "empty"
    empty.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    for out, what in ((typo, "does not exist"), (empty, "is empty"), (other, "holds no pretraining run")):
        rc, err = cli_run(argv(inputs, out, "--resume"), capsys)
        line = error_line(err)
        assert rc == 2 and str(out) in line and what in line, err
    assert not typo.exists() and not any(empty.iterdir()) and sorted(os.listdir(other)) == ["notes.txt"]


def test_train_tokenizer_refuses_a_runs_tokenizer_and_a_run_with_another_tokenizer_says_so(inputs, tmp_path, capsys):
    """Issue 46: `train-tokenizer --out RUN/tokenizer` silently replaced a pretraining run's vocabulary, and the run's
    `--resume` then failed with "no checkpoint could be loaded". Now the command refuses in one line (any directory
    holding a tokenizer too) unless --overwrite, and a run whose tokenizer was replaced names the tokenizer."""
    corpus = inputs[0]
    out = tmp_path / "run"
    rc, err = cli_run(argv(inputs, out, tokenizer=False), capsys)
    assert rc == 0, err
    before = snapshot(out)
    retrain = ["train-tokenizer", "--corpus", str(corpus), "--vocab-size", "60", "--out", str(out / "tokenizer")]
    rc, err = cli_run(retrain, capsys)
    line = error_line(err)
    assert rc == 2 and "is the tokenizer of the pretraining run" in line and "--overwrite" in line, err
    assert snapshot(out) == before
    plain = tmp_path / "tok"
    rc, err = cli_run([*retrain[:-1], str(plain)], capsys)
    assert rc == 0, err
    rc, err = cli_run([*retrain[:-1], str(plain)], capsys)
    line = error_line(err)
    assert rc == 2 and "already holds a tokenizer" in line and "tokenizer.json" in line, err
    rc, err = cli_run([*retrain, "--overwrite"], capsys)
    assert rc == 0, err
    rc, err = cli_run(argv(inputs, out, "--resume", tokenizer=False, steps=4), capsys)
    line = error_line(err)
    assert rc == 2 and "cannot resume: the tokenizer" in line and "120 tokens then, 60 now" in line, err
    assert "no checkpoint" not in line


def test_the_demo_probes_are_printed_on_the_demo_corpus_only(inputs, tmp_path, capsys, caplog):
    """Issue 46: a run on a user's corpus printed the demo world's [MASK] probes, whose answers it cannot know."""
    import logging

    from bertforge.data.demo_world import DEMO_CORPUS

    with caplog.at_level(logging.INFO, logger="bertforge"):
        rc, err = cli_run(argv(inputs, tmp_path / "user", steps=1), capsys)
        assert rc == 0, err
        assert "[MASK] predictions" not in caplog.text + err
        demo = argv(inputs, tmp_path / "demo", steps=1)
        demo[demo.index("--corpus") + 1] = str(DEMO_CORPUS)
        rc, err = cli_run(demo, capsys)
        assert rc == 0, err
    assert "[MASK] predictions before training" in caplog.text + err
    assert "[MASK] predictions after training" in caplog.text + err


# ---------------------------------------------------------------------------------------------- 4. non-finite
def strict_rows(path: Path) -> list[dict]:
    def refuse(token):
        raise ValueError(f"{path}: bare {token} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines() if line.strip()]


def test_a_diverging_run_stops_and_saves_no_nan_weights(inputs, tmp_path, capsys):
    """--lr 1e6: the weights blow up, the loss turns non-finite; after --max-skipped-steps such steps in a row the run
    ends with one line, no model, no checkpoint with a non-finite weight, and a metrics.jsonl of strict JSON."""
    from safetensors.torch import load_file

    out = tmp_path / "run"
    rc, err = cli_run(argv(inputs, out, "--lr", "1e6", "--max-skipped-steps", "3", steps=200), capsys)
    line = error_line(err)
    assert rc == 2 and ("training diverged: 3 steps in a row" in line or "not saving" in line), err
    assert not (out / "model").exists()
    for _, checkpoint in list_checkpoints(out):
        assert all(torch.isfinite(t).all() for t in load_file(str(checkpoint / "model.safetensors")).values())
    rows = strict_rows(out / "metrics.jsonl")
    flagged = [r for r in rows if "nonfinite" in r]
    assert flagged and all(r[k] is None for r in flagged for k in r["nonfinite"]), rows[-3:]
    assert any("loss" in r["nonfinite"] for r in flagged)
    report(f"--lr 1e6: stopped at step {rows[-1]['step']} ({line.split('error: ')[1][:60]}...); "
           f"{len(flagged)} metrics rows with null + nonfinite, all strict JSON")


def test_train_step_stops_after_n_skipped_steps_in_a_row():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    stepper = TrainStep(model, optimizer, scheduler, max_skipped_steps=3)

    def step(bad: bool):
        def forward_backward(batch, weights):
            loss = model(batch["x"]).sum() * (float("nan") if bad else 1.0)
            return {"loss": stepper.accumulate({"loss": loss}, weights)}

        return stepper.run([{"x": torch.ones(2, 3)}], forward_backward, lambda b: {"loss": 2})

    for bad in (True, True, False, True, True, False):  # never three in a row: trains on
        step(bad)
    assert (stepper.skipped_steps, stepper.consecutive_skipped) == (4, 0)
    step(True)
    step(True)
    with pytest.raises(BertforgeError, match="3 steps in a row"):
        step(True)
    assert TrainStep(model, optimizer, scheduler).max_skipped_steps == 10
    with pytest.raises(BertforgeError, match="max-skipped-steps"):
        TrainStep(model, optimizer, scheduler, max_skipped_steps=0)


def test_a_checkpoint_with_non_finite_weights_is_not_saved(inputs, tmp_path):
    corpus, tok, config = inputs
    args = PretrainArgs(corpus=[str(corpus)], tokenizer=str(tok), config=str(config), out=str(tmp_path / "run"),
                        max_steps=2, batch_size=4, max_length=32, progress=False, demo=False, device="cpu")
    with one_torch_thread():
        trainer = Pretrainer(args)
        with torch.no_grad():
            trainer.model.bert.embeddings.word_embeddings.weight[3, 0] = float("inf")
        with pytest.raises(BertforgeError, match="not saving .*word_embeddings"):
            trainer.save_checkpoint()
        with pytest.raises(BertforgeError, match="not saving .*model"):
            trainer.export(tmp_path / "run" / "model")
        trainer.close()
    assert list_checkpoints(tmp_path / "run") == [] and not (tmp_path / "run" / "model").exists()


def test_metrics_log_writes_strict_json(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with MetricsLog(path) as log:
        log.write({"step": 1, "loss": float("nan"), "lr": 1e-4})
        log.write({"step": 2, "type": "eval", "f1": float("inf"), "per_class": {"pos": float("-inf"), "neg": 0.5}})
        log.write({"step": 3, "loss": 1.5})
    rows = strict_rows(path)
    assert rows[0] == {"step": 1, "loss": None, "lr": 1e-4, "nonfinite": ["loss"]}
    assert rows[1]["f1"] is None and rows[1]["per_class"] == {"pos": None, "neg": 0.5}
    assert rows[1]["nonfinite"] == ["f1", "per_class.pos"]
    assert rows[2] == {"step": 3, "loss": 1.5}


# ---------------------------------------------------------------------------------------------- 5. OSError
def test_an_unwritable_out_is_one_line_naming_the_path(inputs, capsys, monkeypatch):
    """A read-only --out (/sys is read-only even for root, which these tests run as) and an OSError from anywhere
    in a command: one line naming the path and the cause, never "internal error"."""
    out = Path("/sys/bertforge-test/run")
    rc, err = cli_run(argv(inputs, out), capsys)
    line = error_line(err)
    assert rc == 2 and "/sys/bertforge-test" in line and "internal error" not in line, err

    def refuse(self, args):
        raise PermissionError(errno.EACCES, "Permission denied", "/data/corpus.txt")

    monkeypatch.setattr(Pretrainer, "__init__", refuse)
    rc, err = cli_run(argv(inputs, Path("/tmp/unused")), capsys)
    assert rc == 2 and error_line(err) == "bertforge pretrain: error: /data/corpus.txt: Permission denied", err


# ---------------------------------------------------------------------------------------------- 6. memory
# the figures docs/guides/precision-and-memory.md gives ("Memory": measured, fp32, seq 128)
DOCUMENTED_ACTIVATIONS_MIB = {"mini": 16, "small": 30, "base": 124}
ESTIMATE_FACTOR = 1.25  # the estimate is held within this factor of every measured figure


def test_memory_estimate_agrees_with_the_measured_figures():
    page = Path(__file__).resolve().parents[2] / "docs" / "guides" / "precision-and-memory.md"
    stated = " ".join(page.read_text(encoding="utf-8").split())
    assert "mini 16 MiB, small 30 MiB, base 124 MiB per sequence" in stated, "the page's figures changed: update these"
    for name, measured in DOCUMENTED_ACTIVATIONS_MIB.items():
        estimate = activation_bytes_per_sequence(BertConfig.preset(name), 128) / MiB
        assert measured / ESTIMATE_FACTOR <= estimate <= measured * ESTIMATE_FACTOR, (name, estimate, measured)
    from bertforge.model import BertForPreTraining, BertForSequenceClassification

    config = BertConfig(**TINY_CONFIG)
    assert parameter_count(config) == sum(p.numel() for p in BertForPreTraining(config).parameters())
    assert parameter_count(config, "classification") == sum(
        p.numel() for p in BertForSequenceClassification(config).parameters())
    assert 1.4e11 < parameter_count(BertConfig(hidden_size=16384, num_attention_heads=64, intermediate_size=65536,
                                               num_hidden_layers=48)) < 1.7e11


def test_a_run_that_cannot_fit_is_refused_with_what_would_fit():
    base = estimate_training_memory(BertConfig.preset("base"), 64, 128)
    room = base.state_bytes + 3 * base.per_sequence + base.per_sequence // 2
    with pytest.raises(BertforgeError) as caught:
        check_fits(base, room, "host", "pretraining --config base")
    message = str(caught.value)
    assert "--batch-size 3" in message and "--gradient-checkpointing" in message
    assert f"{base.parameters:,} parameters" in message and "available" in message
    check_fits(base, base.total, "host", "x")  # exactly enough: no refusal
    with pytest.raises(BertforgeError, match="the parameters alone do not fit"):
        check_fits(base, base.state_bytes // 2, "GPU cuda:0", "x")


def test_finetune_refuses_a_model_that_cannot_fit_before_building_it(tmp_path, monkeypatch):
    import bertforge.model.memory as memory
    from bertforge.finetune import finetune
    from bertforge.model import BertForSequenceClassification

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(dict(TINY_CONFIG)))
    (model / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    data = tmp_path / "train.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{w} {w}\t{i % 2}\n" for i, w in enumerate(WORDS)))
    monkeypatch.setattr(memory, "available_memory", lambda device: (1 << 20, "host"))
    built = []
    monkeypatch.setattr(BertForSequenceClassification, "from_pretrained",
                        classmethod(lambda cls, *args, **kwargs: built.append(args)))
    with pytest.raises(BertforgeError, match="fine-tuning .* needs about .* the host has 1 MiB available"):
        finetune(task="classification", model=str(model), train=str(data), dev=str(data), out=str(tmp_path / "out"),
                 batch_size=8, epochs=1, progress=False)
    assert built == [] and not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- 7. a 1 MB line
def test_a_small_corpus_with_a_1_mb_line_is_not_re_read_to_fill_the_shuffle_buffer(inputs, tmp_path):
    """The issue's near-hang: 21 documents, one a single 1 MB line. 10 batches of 32 took 295 s (170 s on the day of
    the fix, 274 passes over the file): the 10,000-instance shuffle buffer was filled by re-reading and
    re-tokenizing the corpus. Now it holds one epoch's instances: passes follow the instances consumed."""
    from bertforge.pretrain.data import pretraining_stream
    from bertforge.tokenizer import Tokenizer

    _, tok_dir, _ = inputs
    tokenizer = Tokenizer.from_pretrained(tok_dir)
    corpus = make_corpus(tmp_path / "corpus.txt", docs=20)
    rng = random.Random(1)
    line = " ".join(rng.choice(WORDS) for _ in range(170_000))[:1_000_000]
    with open(corpus, "a") as fh:
        fh.write("\n\n" + line + "\n")
    figures = []
    for nsp in (True, False):
        args = PretrainArgs(corpus=[str(corpus)], max_length=128, batch_size=32, nsp=nsp)
        stream = pretraining_stream(args, [str(corpus)], tokenizer, 0, 1, 32)
        started = time.perf_counter()
        for _ in range(10):
            next(stream)
        seconds = time.perf_counter() - started
        passes = stream.stats["epoch"] + 1
        per_epoch = stream.instances.epoch_yield
        assert per_epoch, stream.stats
        # the passes the 320 consumed instances need, plus the epoch read ahead (the NSP window, the buffer)
        assert passes <= math.ceil(320 / per_epoch) + 2, (passes, per_epoch, stream.stats)
        figures.append(f"{'NSP' if nsp else 'no-NSP'} {seconds:.1f} s, {passes} passes")
    report(f"21-document corpus with a 1 MB line, 10 batches of 32: {'; '.join(figures)}")
