"""`bertforge.training.run_dir`: the lock on OUT, the checks before anything is written, `--overwrite`'s set-aside (and its
undoing), and `list_checkpoints`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.pretrain.args import PRETRAINING, RUN_CONFIG
from bertforge.training.run_dir import (REPLACED_DIR, RunDirectory, list_checkpoints, recorded_settings,
                                         settings_to_replay)

SETTINGS = {"lr": 1e-3, "max_steps": 10, "batch_size": 4}


def make_checkpoint(out: Path, name: str, complete: bool = True) -> Path:
    d = out / "checkpoints" / name
    d.mkdir(parents=True)
    if complete:
        (d / "trainer_state.json").write_text("{}")
    return d


def make_run(out: Path, settings=SETTINGS, marker="old") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_CONFIG).write_text(json.dumps(settings))
    (out / "metrics.jsonl").write_text(marker + "\n")
    make_checkpoint(out, "step-5")
    (out / "notes.txt").write_text("mine")  # not a run entry: never touched


def test_list_checkpoints_only_complete_ones_in_step_order(tmp_path):
    assert list_checkpoints(tmp_path) == []  # no checkpoints/ at all
    for name in ("step-10", "step-2", "step-100", "step-9"):
        make_checkpoint(tmp_path, name)
    make_checkpoint(tmp_path, ".step-200")  # a save under way (temporary name)
    make_checkpoint(tmp_path, "step-300", complete=False)  # no trainer_state.json
    make_checkpoint(tmp_path, "step-7.tmp")
    make_checkpoint(tmp_path, "step-x")
    (tmp_path / "checkpoints" / "step-400").write_text("a file, not a directory")
    found = list_checkpoints(tmp_path)
    assert [s for s, _ in found] == [2, 9, 10, 100]  # numeric, not lexical, order
    assert all(p == tmp_path / "checkpoints" / f"step-{s}" for s, p in found)


def test_prepare_on_a_fresh_directory_records_the_settings(tmp_path):
    out = tmp_path / "a" / "run"
    run = RunDirectory(out, resume=False, overwrite=False, settings=SETTINGS, kind=PRETRAINING)
    run.lock_and_check()
    try:
        run.prepare()
        assert json.loads((out / RUN_CONFIG).read_text()) == SETTINGS
        assert run.replaced is None and not (out / REPLACED_DIR).exists()
    finally:
        run.close()
    assert run.lock is None


def test_a_second_process_is_refused_naming_the_holder_pid(tmp_path):
    out = tmp_path / "run"
    run = RunDirectory(out, resume=False, overwrite=False, settings=SETTINGS, kind=PRETRAINING)
    run.lock_and_check()
    try:
        code = ("import sys\nfrom pathlib import Path\nfrom bertforge.training.run_dir import RunDirectory\nfrom bertforge.pretrain.args import PRETRAINING\n"
                "from bertforge.core.errors import BertforgeError\n"
                f"r = RunDirectory(Path({str(out)!r}), False, True, {{}}, PRETRAINING)\n"
                "try:\n    r.lock_and_check()\nexcept BertforgeError as e:\n    print(e); sys.exit(3)\n")
        root = str(Path(__file__).resolve().parents[2])  # this checkout's bertforge
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 3, done.stderr
        assert f"pid {os.getpid()}" in done.stdout and "pretrain" in done.stdout
    finally:
        run.close()
    again = RunDirectory(out, resume=False, overwrite=False, settings=SETTINGS, kind=PRETRAINING)
    again.lock_and_check()  # free once released
    again.close()


def test_a_run_in_out_needs_resume_or_overwrite(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    with pytest.raises(BertforgeError, match="already holds files.*--resume.*--overwrite"):
        RunDirectory(out, resume=False, overwrite=False, settings=SETTINGS, kind=PRETRAINING).check()
    RunDirectory(out, resume=True, overwrite=False, settings=SETTINGS, kind=PRETRAINING).check()
    RunDirectory(out, resume=False, overwrite=True, settings=SETTINGS, kind=PRETRAINING).check()
    # hidden leftovers alone are not a run
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / ".tmp-run_config.json").write_text("x")
    RunDirectory(hidden, resume=False, overwrite=False, settings=SETTINGS, kind=PRETRAINING).check()


def test_out_that_is_a_file_is_refused(tmp_path):
    out = tmp_path / "file"
    out.write_text("x")
    with pytest.raises(BertforgeError, match="not a directory"):
        RunDirectory(out, resume=False, overwrite=True, settings=SETTINGS, kind=PRETRAINING).check()


@pytest.mark.parametrize("state, what", [("missing", "does not exist"), ("empty", "is empty"),
                                         ("other", "holds no pretraining run")])
def test_resume_of_a_directory_with_no_run_is_refused(tmp_path, state, what):
    out = tmp_path / "run"
    if state != "missing":
        out.mkdir()
    if state == "other":
        (out / "something.txt").write_text("x")
    with pytest.raises(BertforgeError, match=f"--resume: .*{what}"):
        RunDirectory(out, resume=True, overwrite=False, settings=SETTINGS, kind=PRETRAINING).check()
    assert out.exists() == (state != "missing")  # nothing was created


def test_resume_refuses_changed_settings_but_allows_resumable_ones(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    RunDirectory(out, True, False, {**SETTINGS, "max_steps": 50, "out": "elsewhere"}, PRETRAINING).check()
    with pytest.raises(BertforgeError, match=r"lr: 0\.001 -> 0\.002"):
        RunDirectory(out, True, False, {**SETTINGS, "lr": 2e-3}, PRETRAINING).check()
    (out / RUN_CONFIG).write_text("{not json")
    with pytest.raises(BertforgeError, match="unreadable"):
        RunDirectory(out, True, False, SETTINGS, PRETRAINING).check()


def test_resume_refuses_a_run_that_records_settings_this_version_lacks(tmp_path):
    """A run begun before a setting was renamed (`seq_len`, now `max_length`) records a value the new settings
    cannot be checked against: refused by name, never resumed with the new name's default."""
    out = tmp_path / "run"
    make_run(out, {**SETTINGS, "seq_len": 32})
    with pytest.raises(BertforgeError, match=r"records settings this version of bertforge does not have \(seq_len\)"):
        RunDirectory(out, True, False, {**SETTINGS, "max_length": 128}, PRETRAINING).check()


def test_recorded_settings_reads_a_settings_file_or_a_run_directory(tmp_path):
    out = tmp_path / "run"
    make_run(out, {**SETTINGS, "resume": True, "overwrite": True, "versions": {"torch": "2.13"}})
    expected = SETTINGS  # what is about one invocation is left out
    assert recorded_settings(out, PRETRAINING) == recorded_settings(out / RUN_CONFIG, PRETRAINING) == expected
    assert settings_to_replay(None, True, str(out), PRETRAINING) == str(out / RUN_CONFIG)  # --resume alone
    assert settings_to_replay(None, False, str(out), PRETRAINING) is None
    assert settings_to_replay("given.json", True, str(out), PRETRAINING) == "given.json"
    with pytest.raises(BertforgeError, match="no such file"):
        recorded_settings(tmp_path / "none.json", PRETRAINING)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(BertforgeError, match="expected a JSON object"):
        recorded_settings(tmp_path / "list.json", PRETRAINING)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BertforgeError, match="not valid JSON"):
        recorded_settings(tmp_path / "bad.json", PRETRAINING)


def test_overwrite_sets_the_old_run_aside_and_abandon_puts_it_back(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    new = {**SETTINGS, "lr": 5e-4}
    run = RunDirectory(out, resume=False, overwrite=True, settings=new, kind=PRETRAINING)
    run.lock_and_check()
    run.prepare()
    aside = out / REPLACED_DIR
    assert run.replaced == aside
    assert (aside / "metrics.jsonl").read_text() == "old\n" and (aside / "checkpoints" / "step-5").is_dir()
    assert json.loads((out / RUN_CONFIG).read_text()) == new and list_checkpoints(out) == []
    assert (out / "notes.txt").read_text() == "mine"
    (out / "metrics.jsonl").write_text("new\n")  # what the new run wrote before it failed
    run.abandon()
    assert run.lock is None and not aside.exists()
    assert (out / "metrics.jsonl").read_text() == "old\n"
    assert json.loads((out / RUN_CONFIG).read_text()) == SETTINGS
    assert [s for s, _ in list_checkpoints(out)] == [5]
    assert (out / "notes.txt").read_text() == "mine"


def test_overwrite_drops_the_old_run_after_the_first_checkpoint(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    run = RunDirectory(out, resume=False, overwrite=True, settings=SETTINGS, kind=PRETRAINING)
    run.lock_and_check()
    run.prepare()
    make_checkpoint(out, "step-1")
    run.drop_replaced()
    run.abandon()  # a failure now keeps the new run
    assert not (out / REPLACED_DIR).exists() and not (out / f"{REPLACED_DIR}.deleting").exists()
    assert [s for s, _ in list_checkpoints(out)] == [1]
    assert not (out / "metrics.jsonl").exists()


def test_the_next_launch_recovers_an_interrupted_overwrite(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    killed = RunDirectory(out, resume=False, overwrite=True, settings={**SETTINGS, "lr": 1.0}, kind=PRETRAINING)
    killed.lock_and_check()
    killed.prepare()
    killed.close()  # as if killed: nothing restored
    assert (out / REPLACED_DIR).is_dir()
    again = RunDirectory(out, resume=True, overwrite=False, settings=SETTINGS, kind=PRETRAINING)
    again.lock_and_check()  # the old run is back, so it can be resumed
    again.close()
    assert not (out / REPLACED_DIR).exists() and (out / "metrics.jsonl").read_text() == "old\n"


def test_prepare_removes_the_remains_of_a_killed_save(tmp_path):
    out = tmp_path / "run"
    make_run(out)
    stale = make_checkpoint(out, ".step-6", complete=False)
    run = RunDirectory(out, resume=True, overwrite=False, settings=SETTINGS, kind=PRETRAINING)
    run.lock_and_check()
    run.prepare()
    run.close()
    assert not stale.exists() and [s for s, _ in list_checkpoints(out)] == [5]


def test_a_directory_holding_something_else_is_refused_by_name(tmp_path):
    """`refuse_foreign`: files without the kind's settings file are another thing's, refused (--overwrite or not);
    the kind's own run, an empty directory, hidden remains and a missing directory pass."""
    from bertforge.core.errors import BertforgeError
    from bertforge.training.run_dir import RunDirectory, RunKind

    kind = RunKind(command="x", what="x run", config_file="x.json", entries=("x.json",), resumable=frozenset())
    out = tmp_path / "out"
    RunDirectory(out, False, True, {}, kind).refuse_foreign()  # missing
    out.mkdir()
    (out / ".hidden").write_text("")
    RunDirectory(out, False, True, {}, kind).refuse_foreign()  # empty but for hidden remains
    (out / "notes.txt").write_text("mine")
    with pytest.raises(BertforgeError, match=r"holds files that are not a bertforge x run; choose another directory "
                                             r"\(--overwrite replaces only a x run\)"):
        RunDirectory(out, False, True, {}, kind).refuse_foreign()
    (out / "x.json").write_text("{}")
    RunDirectory(out, False, True, {}, kind).refuse_foreign()  # its own run (with a file beside it)
