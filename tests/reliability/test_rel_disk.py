"""A full disk and a read-only output directory: every save raises a BertforgeError that names the file and the
reason, and leaves what was there before intact and loadable, with no temporary files behind.

Failures are made three ways: RLIMIT_FSIZE (the kernel refuses a write past a chosen byte, so the real writers,
safetensors' Rust code included, see a real I/O error: "File too large"), a tiny tmpfs (a real ENOSPC; only where
`mount` is allowed) and patching (EROFS and failures at chosen calls). Tests run as root, so chmod cannot make a
directory read-only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import torch

from bertforge import BertConfig, BertForPreTraining, BertforgeError
from bertforge.core import io as bf_io
from bertforge.pretrain.trainer import PretrainArgs, Pretrainer
from bertforge.training.run_dir import list_checkpoints
from bertforge.core.state import load_state
from tests.helpers import TINY_CONFIG, make_run_inputs, tiny_run_args
from tests.reliability.rel_helpers import one_torch_thread, report, stray_temporaries, tensors_differ

resource = pytest.importorskip("resource")


@contextlib.contextmanager
def file_size_limit(limit: int):
    """Writes beyond `limit` bytes of any file fail with EFBIG (SIGXFSZ ignored) until the block ends."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def tiny_model(seed: int, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(BertConfig(**{**TINY_CONFIG, **overrides}))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.fixture
def saved(tmp_path) -> tuple[Path, dict[str, bytes], dict[str, torch.Tensor]]:
    """A model directory holding a first save, its bytes and its weights."""
    target = tmp_path / "model"
    model = tiny_model(0)
    model.save_pretrained(target)
    return target, snapshot(target), {k: v.clone() for k, v in model.state_dict().items()}


def assert_untouched(target: Path, before: dict[str, bytes], weights: dict[str, torch.Tensor]) -> None:
    assert snapshot(target) == before, "the previous save was modified"
    assert not stray_temporaries(target.parent), stray_temporaries(target.parent)
    reloaded = BertForPreTraining.from_pretrained(target)
    assert not tensors_differ(weights, reloaded.state_dict())


# ---------------------------------------------------------------------------------------------- save_pretrained


@pytest.mark.parametrize("seed", range(6))
def test_save_pretrained_with_the_disk_full_at_a_random_byte(saved, seed):
    """The new weights (a bigger vocabulary) stop at a random byte; the old save stays whole."""
    target, before, weights = saved
    bigger = tiny_model(seed + 1, vocab_size=400)
    limit = random.Random(seed).randrange(1, len(before["model.safetensors"]))
    with file_size_limit(limit), pytest.raises(BertforgeError) as caught:
        bigger.save_pretrained(target)
    message = str(caught.value)
    assert "model.safetensors" in message and "File too large" in message, message
    assert "\n" not in message
    assert_untouched(target, before, weights)


def test_save_pretrained_when_config_json_fails_after_the_weights(saved, monkeypatch):
    """Weights written, then config.json fails: neither file may change (no new weights beside an old config)."""
    target, before, weights = saved
    real = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name.startswith(".config.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(BertforgeError, match=r"config\.json: No space left on device"):
        tiny_model(1, vocab_size=400).save_pretrained(target)
    monkeypatch.undo()
    assert_untouched(target, before, weights)


@pytest.mark.parametrize("where", ["mkstemp", "replace", "mkdir"])
def test_save_pretrained_into_a_read_only_directory(saved, monkeypatch, where):
    target, before, weights = saved
    erofs = OSError(errno.EROFS, "Read-only file system")

    def refuse(*args, **kwargs):
        raise erofs

    if where == "mkstemp":
        monkeypatch.setattr(tempfile, "mkstemp", refuse)
        destination = target
    elif where == "replace":
        monkeypatch.setattr(os, "replace", refuse)
        destination = target
    else:
        monkeypatch.setattr(Path, "mkdir", refuse)
        destination = target.parent / "new" / "model"
    with pytest.raises(BertforgeError, match="Read-only file system") as caught:
        tiny_model(1).save_pretrained(destination)
    assert str(destination) in str(caught.value)
    monkeypatch.undo()
    assert_untouched(target, before, weights)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 192 KiB tmpfs: a real ENOSPC. Skipped where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount)], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("cannot run mount")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


def test_save_pretrained_on_a_really_full_disk(tiny_tmpfs):
    target = tiny_tmpfs / "model"
    first = tiny_model(0)
    first.save_pretrained(target)  # ~107 KB of 192 KiB
    before = snapshot(target)
    with pytest.raises(BertforgeError, match="No space left on device") as caught:
        tiny_model(1).save_pretrained(target)  # the second copy does not fit beside the first
    assert "model.safetensors" in str(caught.value)
    assert_untouched(target, before, first.state_dict())


# ---------------------------------------------------------------------------------------------- atomic_directory


def no_exchange(monkeypatch, how: str) -> None:
    """Make atomic_directory take its two-rename fallback: no renameat2 at all, or one failing as an old kernel
    (ENOSYS) or a filesystem without RENAME_EXCHANGE (EINVAL) would."""
    if how == "no renameat2":
        monkeypatch.setattr(bf_io, "_renameat2", None)
        return
    code = errno.ENOSYS if how == "ENOSYS" else errno.EINVAL

    def refuse(*args):
        ctypes.set_errno(code)
        return -1

    monkeypatch.setattr(bf_io, "_renameat2", refuse)


@pytest.mark.parametrize("how", ["no renameat2", "ENOSYS", "EINVAL"])
@pytest.mark.parametrize("failing_call", [1, 2])
def test_atomic_directory_failing_rename_puts_the_old_directory_back(tmp_path, monkeypatch, failing_call, how):
    """Without RENAME_EXCHANGE, replacing an existing directory takes two renames (old aside, new in); either may
    fail."""
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    no_exchange(monkeypatch, how)
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((src, dst))
        if len(calls) == failing_call:
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    with pytest.raises(BertforgeError, match="Input/output error"):
        with bf_io.atomic_directory(target) as tmp:
            (tmp / "weights").write_text("new")
            monkeypatch.setattr(os, "replace", flaky)
    monkeypatch.undo()
    assert len(calls) >= failing_call
    assert (target / "weights").read_text() == "old"
    assert not stray_temporaries(tmp_path), stray_temporaries(tmp_path)


@pytest.mark.parametrize("how", ["no renameat2", "ENOSYS", "EINVAL"])
def test_atomic_directory_without_exchange_replaces_in_two_renames(tmp_path, monkeypatch, how):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    no_exchange(monkeypatch, how)
    real, calls = os.replace, []
    monkeypatch.setattr(os, "replace", lambda src, dst: calls.append((src, dst)) or real(src, dst))
    with bf_io.atomic_directory(target) as tmp:
        (tmp / "weights").write_text("new")
    assert len(calls) == 2
    assert (target / "weights").read_text() == "new"
    assert sorted(tmp_path.iterdir()) == [target]


linux_exchange = pytest.mark.skipif(bf_io._renameat2 is None, reason="renameat2 (Linux) is not available here")


@linux_exchange
def test_atomic_directory_replaces_with_one_exchange_on_linux(tmp_path, monkeypatch):
    """On Linux an existing directory is swapped with the new one by renameat2(RENAME_EXCHANGE): no os.replace."""
    with pytest.raises(FileNotFoundError):
        bf_io.exchange_paths(tmp_path / "missing-a", tmp_path / "missing-b")
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")
    (target / "sub").mkdir()
    (target / "sub" / "x").write_text("old")
    real, exchanges, replaces = bf_io._renameat2, [], []

    def spy(*args):
        exchanges.append(args)
        return real(*args)

    monkeypatch.setattr(bf_io, "_renameat2", spy)
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *args: replaces.append(args) or real_replace(*args))
    with bf_io.atomic_directory(target) as tmp:
        (tmp / "weights").write_text("new")
    assert len(exchanges) == 1 and exchanges[0][4] == 2 and exchanges[0][3] == os.fsencode(target)
    assert not replaces
    assert (target / "weights").read_text() == "new" and sorted(p.name for p in target.iterdir()) == ["weights"]
    assert sorted(tmp_path.iterdir()) == [target]  # the old directory was removed
    with bf_io.atomic_directory(tmp_path / "fresh") as tmp:  # nothing to exchange with: a plain rename
        (tmp / "weights").write_text("first")
    monkeypatch.undo()
    assert len(exchanges) == 1 and len(replaces) == 1
    assert (tmp_path / "fresh" / "weights").read_text() == "first"


@linux_exchange
def test_atomic_directory_failing_exchange_leaves_the_old_directory(tmp_path, monkeypatch):
    target = tmp_path / "model"
    target.mkdir()
    (target / "weights").write_text("old")

    def failing(*args):
        ctypes.set_errno(errno.EIO)
        return -1

    monkeypatch.setattr(bf_io, "_renameat2", failing)
    with pytest.raises(BertforgeError, match="Input/output error"):
        with bf_io.atomic_directory(target) as tmp:
            (tmp / "weights").write_text("new")
    assert (target / "weights").read_text() == "old"
    assert not stray_temporaries(tmp_path), stray_temporaries(tmp_path)


def generation(target: Path) -> int:
    """The generation of the complete directory written by `replace_forever` that `target` names; fails the test if
    `target` is missing (FileNotFoundError) or incomplete. A directory opened just before it was swapped out may lose
    its files to the removal of the old directory: then `target` is looked at again."""
    for _ in range(1000):
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
        try:
            found = []
            for name in ("a", "sub/b"):
                file = os.open(name, os.O_RDONLY, dir_fd=fd)
                found.append(os.read(file, 100))
                os.close(file)
        except FileNotFoundError:
            continue
        finally:
            os.close(fd)
        assert found[0] and found[0] == found[1], f"incomplete directory: {found}"
        return int(found[0])
    pytest.fail(f"{target} stays incomplete")


def replace_forever(target: Path, start: int) -> None:
    n = start
    while True:
        n += 1
        with bf_io.atomic_directory(target) as tmp:
            (tmp / "a").write_text(str(n))
            (tmp / "sub").mkdir()
            (tmp / "sub" / "b").write_text(str(n))


@linux_exchange
def test_atomic_directory_target_is_always_complete(tmp_path):
    """A process replaces `target` over and over while the test looks at it at every moment it can, and SIGKILLs
    it at random moments: `target` is always there and always a complete directory, the old or the new one (two
    renames leave a moment with no `target` at all)."""
    target = tmp_path / "model"
    with bf_io.atomic_directory(target) as tmp:
        (tmp / "a").write_text("0")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b").write_text("0")
    rng = random.Random(0)
    looks = kills = 0
    last = 0
    for _ in range(20):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                replace_forever(target, last)
            finally:
                os._exit(1)
        try:
            deadline = time.monotonic() + rng.uniform(0.05, 0.2)
            while time.monotonic() < deadline:
                generation(target)
                looks += 1
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        kills += 1
        seen = generation(target)
        assert seen >= last
        last = seen
        for leftover in stray_temporaries(tmp_path):  # a killed replacement's temporaries, as a new run finds them
            shutil.rmtree(leftover, ignore_errors=True)
    assert last > 20  # the child did replace the directory
    report(f"atomic_directory with RENAME_EXCHANGE: {last} replacements, {looks:,} looks during them and {kills} "
           f"SIGKILLs, target always a complete directory")


def test_atomic_writes_have_ordinary_permissions(tmp_path):
    """mkstemp/mkdtemp make 0600/0700; a saved model must be readable like any other file (umask applies)."""
    old = os.umask(0o022)
    try:
        tiny_model(0).save_pretrained(tmp_path / "model")
        with bf_io.atomic_directory(tmp_path / "ckpt") as tmp:
            (tmp / "x").write_text("x")
    finally:
        os.umask(old)
    assert (tmp_path / "model" / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "model" / "config.json").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "ckpt").stat().st_mode & 0o777 == 0o755


# ---------------------------------------------------------------------------------------------- training checkpoints


@pytest.fixture(scope="module")
def run_inputs(tmp_path_factory):
    return make_run_inputs(tmp_path_factory.mktemp("disk_inputs"))


def run_args(run_inputs, out: Path, **kw) -> PretrainArgs:
    return tiny_run_args(run_inputs, out, **{"max_steps": 4, "lr": 1e-3, "warmup_steps": 2, "save_every": 2,
                                             "log_every": 2, **kw})


def test_saved_tokenizer_files_have_ordinary_permissions(run_inputs, tmp_path):
    from bertforge.tokenizer import Tokenizer

    old = os.umask(0o022)
    try:
        Tokenizer.from_pretrained(run_inputs[1]).save_pretrained(tmp_path / "tok")
    finally:
        os.umask(old)
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "tok").iterdir()}
    assert set(modes.values()) == {"0o644"}, modes


@pytest.mark.parametrize("failure", ["disk full, seed 0", pytest.param("disk full, seed 1", marks=pytest.mark.slow),
                                     pytest.param("disk full, seed 2", marks=pytest.mark.slow), "read-only"])
def test_checkpoint_save_failure_keeps_the_previous_checkpoint(run_inputs, tmp_path, monkeypatch, failure):
    """step-2 is saved; saving step-4 fails - at a random byte of one of its files (weights, optimizer, data
    position, ...), or because the directory turned read-only: a BertforgeError names step-4 and the reason,
    step-2 stays loadable, nothing temporary is left, and a resume continues from step 2."""
    out = tmp_path / "run"
    real_save = Pretrainer.save_checkpoint
    rng, limits = random.Random(failure), []

    def save(self):
        if self.step != 4:
            return real_save(self)
        if failure == "read-only":
            def read_only(*args, **kwargs):
                raise OSError(errno.EROFS, "Read-only file system")

            with monkeypatch.context() as patch:
                patch.setattr(tempfile, "mkdtemp", read_only)
                return real_save(self)
        # a random byte below the size of step-2's biggest file (data.json, ~2 MB)
        biggest = max(f.stat().st_size for f in (out / "checkpoints" / "step-2").iterdir())
        limits.append(rng.randrange(1, int(0.9 * biggest)))
        with file_size_limit(limits[-1]):
            return real_save(self)

    monkeypatch.setattr(Pretrainer, "save_checkpoint", save)
    with one_torch_thread(), pytest.raises(BertforgeError) as caught:
        Pretrainer(run_args(run_inputs, out)).run()
    message = str(caught.value)
    reason = "Read-only file system" if failure == "read-only" else "File too large"
    assert "step-4" in message and reason in message, (limits, message)
    monkeypatch.undo()
    assert [s for s, _ in list_checkpoints(out)] == [2]
    assert not stray_temporaries(out), stray_temporaries(out)
    step2 = out / "checkpoints" / "step-2"
    BertForPreTraining.from_pretrained(step2)
    for name in ("optimizer", "scheduler", "rng", "data"):
        load_state(step2, name)
    with one_torch_thread():
        trainer = Pretrainer(run_args(run_inputs, out, resume=True))
        trainer.resume()
    assert trainer.step == 2


def test_pretrain_cli_reports_a_full_disk_in_one_line(run_inputs, tmp_path, monkeypatch, capsys):
    """The same failure through `bertforge pretrain`: exit 2 and one line naming the checkpoint, no traceback."""
    from bertforge import cli

    real_save = Pretrainer.save_checkpoint

    def save(self):
        with file_size_limit(50_000):
            return real_save(self)

    monkeypatch.setattr(Pretrainer, "save_checkpoint", save)
    corpus, tok, config = run_inputs
    with one_torch_thread():
        rc = cli.main(["pretrain", "--corpus", str(corpus), "--tokenizer", str(tok), "--config", str(config),
                       "--out", str(tmp_path / "run"), "--max-steps", "2", "--save-every", "2", "--batch-size", "4",
                       "--max-length", "32", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("bertforge pretrain: error: cannot write ") and "step-2" in last and "File too large" in last
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------- pruning


def test_a_kill_while_pruning_leaves_no_half_checkpoint_listed(run_inputs, tmp_path, monkeypatch):
    """keep_checkpoints pruning killed midway (every file but trainer_state.json deleted: the worst order) must leave
    nothing that list_checkpoints() calls complete, and the next start clears the remains. (A plain rmtree of
    step-N left a listed half-checkpoint, until pretrain.py renamed the directory to '.step-N.deleting' first.)"""
    out = tmp_path / "run"
    real_rmtree = shutil.rmtree

    class Killed(BaseException):
        pass

    def dies_midway(path, *args, **kwargs):
        path = Path(path)
        if "step-" in path.name and path.parent.name == "checkpoints" and not path.name.endswith(".tmp"):
            for file in sorted(path.iterdir()):  # pruning, under whatever name: delete, then die
                if file.name != "trainer_state.json":
                    file.unlink()
            raise Killed()
        return real_rmtree(path, *args, **kwargs)

    with one_torch_thread():
        Pretrainer(run_args(run_inputs, out, max_steps=4, keep_checkpoints=1)).run()  # step-2, then step-4 prunes step-2
    monkeypatch.setattr(shutil, "rmtree", dies_midway)
    with one_torch_thread(), pytest.raises(Killed):
        Pretrainer(run_args(run_inputs, out, max_steps=6, keep_checkpoints=1, resume=True)).run()  # step-6 prunes step-4
    monkeypatch.undo()
    listed = list_checkpoints(out)
    assert [step for step, _ in listed] == [6]
    for _, path in listed:
        BertForPreTraining.from_pretrained(path)
    with one_torch_thread():
        Pretrainer(run_args(run_inputs, out, max_steps=6, keep_checkpoints=1, resume=True))
    assert not [p.name for p in (out / "checkpoints").iterdir() if p.name.startswith(".")]
