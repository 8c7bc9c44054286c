"""`train_embeddings` on the run lifecycle: a run stopped after any step and resumed from its newest checkpoint ends
with the weights (bit for bit), the metrics rows and the eval.json of a run never stopped; what --out may hold,
and a resume with other settings, are refused in one line. (A topic file of `tests/embeddings_train/test_api.py`.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.core.errors import BertforgeError
from bertforge.embeddings_train import train_embeddings
from bertforge.training.run_dir import list_checkpoints

from tests.helpers import same_run, stopped_after

pytestmark = pytest.mark.usefixtures("one_thread")

# the toy task's 64 pairs in batches of 16: 4 steps an epoch, 8 in all; dropout on (the tiny model's 0.1)
RUN = dict(epochs=2, batch_size=16, lr=1e-3, eval_every=3, log_every=3, save_every=2, seed=5, max_length=16,
           eval_batch_size=16, device="cpu", progress=False)






def run(tiny: Path, toy: tuple[Path, Path], out: Path, **settings) -> dict:
    return train_embeddings(model=str(tiny), train=str(toy[0]), dev=str(toy[1]), out=str(out), **{**RUN, **settings})


def run_stopped_after(monkeypatch, step: int, *args, **settings) -> None:
    """`run(*args, **settings)`, stopped (as if killed) right after optimizer step `step`."""
    stopped_after(monkeypatch, step, lambda: run(*args, **settings))




@pytest.fixture(scope="module", params=[None, 12], ids=["plain", "cached"])
def reference(request, tiny, toy, tmp_path_factory) -> tuple[Path, int | None]:
    out = tmp_path_factory.mktemp("reference") / "run"
    run(tiny, toy, out, mini_batch_size=request.param)
    return out, request.param


@pytest.mark.parametrize("stop", [3, 4])
def test_a_run_stopped_and_resumed_ends_as_the_run_never_stopped(tiny, toy, reference, tmp_path, monkeypatch, stop):
    """Stopped after step 3 (between the checkpoints of steps 2 and 4: step 3 is trained again, its dropout masks
    too) and step 4 (the epoch's last, before its evaluation and checkpoint); with gradient caching as well."""
    ref, mini = reference
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, stop, tiny, toy, out, mini_batch_size=mini)
    assert not (out / "eval.json").exists() and [s for s, _ in list_checkpoints(out)] == [2]
    run(tiny, toy, out, mini_batch_size=mini, resume=True)
    same_run(ref, out, "model.safetensors")
    assert [s for s, _ in list_checkpoints(out)] == [8]
    assert json.loads((out / "eval.json").read_text())["before"] is not None  # the baseline came from the checkpoint


def test_out_is_checked_before_anything_is_written(tiny, toy, tmp_path, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(BertforgeError, match="not a bertforge train-embeddings run"):
        run(tiny, toy, foreign, overwrite=True)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    with pytest.raises(BertforgeError, match="there is no run to resume"):
        run(tiny, toy, tmp_path / "missing", resume=True)
    with pytest.raises(BertforgeError, match="--resume and --overwrite contradict"):
        run(tiny, toy, tmp_path / "x", resume=True, overwrite=True)


def test_a_resume_with_other_settings_is_refused_in_one_line(tiny, toy, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    run_stopped_after(monkeypatch, 2, tiny, toy, out)
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--dev", str(toy[1]), "--out",
               str(out), "--epochs", "2", "--batch-size", "16", "--lr", "2e-3", "--seed", "5", "--resume",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "lr: 0.001 -> 0.002" in err, err


def test_overwrite_keeps_the_previous_run_until_the_first_checkpoint(tiny, toy, tmp_path, monkeypatch):
    """The new run fails before its first checkpoint: the previous run is back in place, unchanged."""
    out = tmp_path / "run"
    run(tiny, toy, out, epochs=1, save_every=0)
    before = (out / "model.safetensors").read_bytes()
    run_stopped_after(monkeypatch, 1, tiny, toy, out, overwrite=True)
    assert (out / "model.safetensors").read_bytes() == before and (out / "eval.json").is_file()
    assert not (out / ".replaced-run").exists()
    run(tiny, toy, out, epochs=1, save_every=0, seed=6, overwrite=True)
    assert (out / "model.safetensors").read_bytes() != before
    assert json.loads((out / "train_embeddings_config.json").read_text())["seed"] == 6
