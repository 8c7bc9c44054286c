"""Fine-tuning checkpoints and --resume: a run stopped after any step and resumed ends with the weights (bit for bit),
the metrics rows and the evaluation record of a run never stopped; a resume with other settings is refused; the
metrics reach TensorBoard. (Killed with SIGKILL in a subprocess: tests/reliability/test_rel_finetune_crash.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.core.errors import BertforgeError
from bertforge.finetune import finetune
from bertforge.training.run_dir import list_checkpoints

from .conftest import write_sentiment

from tests.helpers import metrics_rows as rows, same_run, stopped_after

pytestmark = pytest.mark.usefixtures("one_thread")

# 20 examples in batches of 4: 5 steps an epoch, 10 in all; an evaluation every 3 steps and at each epoch's end
RUN = dict(task="classification", epochs=2, batch_size=4, lr=1e-3, eval_every=3, log_every=3, seed=3,
           progress=False, device="cpu")






@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("resume_data")
    return write_sentiment(root / "train.tsv", 20), write_sentiment(root / "dev.tsv", 8)


def run(model: Path, data: tuple[Path, Path], out: Path, **settings) -> dict:
    return finetune(model=str(model), train=str(data[0]), dev=str(data[1]), out=str(out), **{**RUN, **settings})


def run_stopped_after(monkeypatch, step: int, *args, **settings) -> None:
    """`run(*args, **settings)`, stopped (as if killed) right after optimizer step `step`."""
    stopped_after(monkeypatch, step, lambda: run(*args, **settings))




@pytest.fixture(scope="module")
def reference(tiny_model, data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "run"
    run(tiny_model, data, out, save_every=2)
    return out


@pytest.mark.parametrize("stop", [1, 4, 5, 7])
def test_a_run_stopped_after_any_step_resumes_to_the_same_end(tiny_model, data, reference, tmp_path, monkeypatch, stop):
    """Stopped right after step 1 (no checkpoint yet: the run starts again), 4 (before its checkpoint), 5 (the
    epoch's last step, before its evaluation and checkpoint) and 7 (between checkpoints: step 7 is done again)."""
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, stop, tiny_model, data, out, save_every=2)
    assert not (out / "eval.json").exists()
    saved = [s for s, _ in list_checkpoints(out)]
    assert saved == ([] if stop == 1 else [{4: 2, 5: 4, 7: 6}[stop]])  # --keep-checkpoints 1
    run(tiny_model, data, out, save_every=2, resume=True)
    same_run(reference, out)
    assert [s for s, _ in list_checkpoints(out)] == [10]


def test_the_best_weights_and_early_stopping_survive_a_resume(tiny_model, data, tmp_path, monkeypatch):
    """An evaluation every step with early stopping: the best weights are older than the checkpoint resumed
    from, and the count of evaluations without improvement carries on across the resume."""
    settings = dict(eval_every=1, early_stop_patience=2, lr=3e-3, epochs=3, keep_checkpoints=2, save_every=1)
    reference = tmp_path / "reference"
    summary = run(tiny_model, data, reference, **settings)
    assert summary["stopped_early"]
    stopped_at = summary["train_steps"]
    best = summary["step"]
    assert best < stopped_at - 1  # else the test shows nothing about older best weights
    out = tmp_path / "run"
    # stopped before the evaluation that stops the run
    run_stopped_after(monkeypatch, stopped_at, tiny_model, data, out, **settings)
    step, checkpoint = list_checkpoints(out)[-1]
    assert step == stopped_at - 1 and (checkpoint / "evaluation.safetensors").is_file()  # the best weights, older
    run(tiny_model, data, out, resume=True, **settings)
    same_run(reference, out)


def test_a_resume_with_other_settings_is_refused_in_one_line(tiny_model, data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, 3, tiny_model, data, out, save_every=2)
    before = sorted(p.name for p in out.rglob("*"))
    args = ["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(data[0]),
            "--dev", str(data[1]), "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3",
            "--eval-every", "3", "--log-every", "3", "--seed", "3", "--device", "cpu", "--no-progress", "--resume"]
    assert main([*args, "--lr", "2e-3"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--resume with settings that differ" in err and "lr: 0.001 -> 0.002" in err
    assert sorted(p.name for p in out.rglob("*")) == before  # nothing written
    with pytest.raises(BertforgeError, match="--resume and --overwrite contradict"):
        run(tiny_model, data, out, resume=True, overwrite=True)
    # what may change: where checkpoints go and how many are kept, the logging
    assert main([*args, "--save-every", "1", "--keep-checkpoints", "3"]) == 0
    capsys.readouterr()
    assert [s for s, _ in list_checkpoints(out)] == [8, 9, 10]


def test_resume_with_only_out_continues_the_recorded_run(tiny_model, data, reference, tmp_path, monkeypatch, capsys):
    """`bertforge finetune --resume --out RUN`: the settings come from RUN/finetune_config.json."""
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, 5, tiny_model, data, out, save_every=2)
    assert main(["finetune", "--resume", "--out", str(out)]) == 0
    capsys.readouterr()
    same_run(reference, out)
    assert main(["finetune", "--resume", "--out", str(out)]) == 0  # a finished run: nothing left to train
    assert json.loads(capsys.readouterr().out)["train_steps"] == 10
    same_run(reference, out)


def test_an_overwrite_stopped_before_its_first_checkpoint_puts_the_previous_run_back(reference, tiny_model, data,
                                                                                     tmp_path, monkeypatch):
    out = Path(shutil.copytree(reference, tmp_path / "run"))
    run_stopped_after(monkeypatch, 1, tiny_model, data, out, save_every=2, seed=4, overwrite=True)
    same_run(reference, out)
    assert [s for s, _ in list_checkpoints(out)] == [10] and not (out / ".replaced-run").exists()
    run(tiny_model, data, out, save_every=2, seed=4, overwrite=True)
    assert json.loads((out / "finetune_config.json").read_text())["seed"] == 4


def test_resume_refuses_a_directory_without_a_run(tiny_model, data, tmp_path, capsys):
    assert main(["finetune", "--resume", "--out", str(tmp_path / "nothing")]) == 2
    assert "(--resume found no finetune_config.json in" in capsys.readouterr().err
    with pytest.raises(BertforgeError, match="there is no run to resume"):
        run(tiny_model, data, tmp_path / "nothing", resume=True)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(BertforgeError, match=r"holds no fine-tuning run \(no finetune_config.json\)"):
        run(tiny_model, data, tmp_path / "other", resume=True)


def test_metrics_reach_tensorboard(reference):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(reference / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/loss", "train/lr", "eval/accuracy", "eval/loss"} <= tags
    logged = [(r["step"], r["loss"]) for r in rows(reference) if r["type"] == "train"]
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("train/loss")] == logged


def test_a_resumed_run_rewrites_tensorboard_from_its_checkpoint(reference, tiny_model, data, tmp_path, monkeypatch):
    """The steps done again after a resume replace those of the stopped launch in TensorBoard too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    run_stopped_after(monkeypatch, 7, tiny_model, data, out, save_every=2)
    run(tiny_model, data, out, save_every=2, resume=True)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [r["step"] for r in rows(out) if r["type"] == "train"]


@pytest.mark.parametrize("change", ["fewer rows", "labels flipped", "dev file"])
def test_a_resume_after_the_data_changed_is_refused_in_one_line(tiny_model, data, tmp_path, monkeypatch, capsys, change):
    """The checkpoint records the training and dev files (name, size, digest of their bytes): a resume on other
    data, even of the same size (the labels flipped), is refused naming the file, not continued as if nothing
    happened."""
    root = tmp_path / "data"
    root.mkdir()
    copy = (Path(shutil.copy(data[0], root / "train.tsv")), Path(shutil.copy(data[1], root / "dev.tsv")))
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, 3, tiny_model, copy, out, save_every=2)
    assert [s for s, _ in list_checkpoints(out)] == [2]
    if change == "fewer rows":
        write_sentiment(copy[0], 6)
    elif change == "labels flipped":
        text = copy[0].read_text()
        copy[0].write_text(text.replace("\tpos", "\tPOS").replace("\tneg", "\tpos").replace("\tPOS", "\tneg"))
        assert len(copy[0].read_text()) == len(text)
    else:
        write_sentiment(copy[1], 6)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    args = ["finetune", "--task", "classification", "--model", str(tiny_model), "--train", str(copy[0]),
            "--dev", str(copy[1]), "--out", str(out), "--epochs", "2", "--batch-size", "4", "--lr", "1e-3",
            "--eval-every", "3", "--log-every", "3", "--seed", "3", "--device", "cpu", "--no-progress", "--resume",
            "--save-every", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    name = "dev.tsv" if change == "dev file" else "train.tsv"
    assert len(err.splitlines()) == 1 and "cannot resume: the training or dev data (--train, --dev) differs" in err, err
    assert f"was {name} (" in err and ("contents" in err) == (change == "labels flipped"), err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # nothing written
