"""The output directory of a training run (OUT): its lock, the checks made before anything is written, the
settings it records, and `--overwrite`'s care for the run it replaces. Rank 0 alone acts on it. Each trainer
describes its directory with a `RunKind` (pretraining's in `pretrain/args.py`, fine-tuning's in `finetune/api.py`,
the GLUE suite's in `finetune/glue.py`): its settings file, its entries and the settings a resume may change.

`--overwrite` never loses the previous run before the new one is worth keeping: the previous run's entries are
moved (renamed, nothing deleted) into OUT/.replaced-run/ once the new run has been checked, deleted when the new run
has its first checkpoint, and put back if it fails before (or, after a SIGKILL, by the next launch into OUT).
The GLUE suite drops the run it replaced once its first task is done.

A trainer whose OUT is its alone (fine-tuning, GLUE, embedding training) refuses an OUT holding something else,
`--overwrite` or not (`RunDirectory.refuse_foreign`). Every trainer records its settings in OUT (its
`RunKind.config_file`) and replays them with `--run-config FILE|RUN`, or with `--resume --out RUN` alone RUN's own
(`recorded_settings`, `settings_to_replay`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import Any

from ..core.errors import BertforgeError
from ..core.io import RunLock, atomic_write_text, lock_run_directory

log = logging.getLogger("bertforge")

CHECKPOINT_RE = re.compile(r"^step-(\d+)$")
# Where --overwrite keeps the run it replaces (OUT/.replaced-run/) until the new run has its first checkpoint.
REPLACED_DIR = ".replaced-run"
# What a settings file records about one invocation rather than the run: a replay (`--run-config`) leaves it out
INVOCATION_ONLY = ("resume", "overwrite", "versions")


@dataclass(frozen=True)
class RunKind:
    """What kind of run a directory holds: the command that writes it (named by its lock), the file recording its
    settings, the entries it writes (all that --overwrite replaces), the settings a resume may change."""

    command: str
    what: str
    config_file: str
    entries: tuple[str, ...]
    resumable: frozenset[str]
    resume_option: bool = True  # whether the command has --resume (GLUE's has not)


def recorded_settings(source: str | Path, kind: RunKind) -> dict[str, Any]:
    """The settings a run of `kind` recorded, to start a run from (`--run-config`): `source` is its settings file or
    the run's directory. What is about one invocation (--resume, --overwrite, the versions) is left out. A file that
    is missing or not a JSON object is one line naming it."""
    path = Path(source)
    if path.is_dir():
        path = path / kind.config_file
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertforgeError(f"--run-config {source}: no such file (a {kind.what}'s settings are OUT/"
                             f"{kind.config_file})") from None
    except OSError as err:
        raise BertforgeError(f"--run-config {path}: cannot read ({err.strerror or err})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BertforgeError(f"--run-config {path}: not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise BertforgeError(f"--run-config {path}: expected a JSON object of settings")
    return {k: v for k, v in data.items() if k not in INVOCATION_ONLY}


def settings_to_replay(run_config: str | None, resume: bool, out: str | None, kind: RunKind) -> str | None:
    """Where a command's settings start from: --run-config, or with --resume alone the settings file of the run in
    --out (`--resume --out RUN` continues RUN without its options given again); None: the defaults."""
    if run_config:
        return run_config
    if resume and out and (Path(out) / kind.config_file).is_file():
        return str(Path(out) / kind.config_file)
    return None


def _changed(before: dict[str, Any], now: dict[str, Any], resumable: frozenset[str],
             prefix: str = "") -> list[tuple[str, Any, Any]]:
    """(name, recorded value, value now) of each setting that differs and may not (`resumable` names those that
    may; a group of settings, such as GLUE's "finetune", is compared setting by setting: "finetune.lr")."""
    out = []
    for key in sorted(now):
        name, then = prefix + key, before.get(key, now[key])
        if name in resumable or then == now[key]:
            continue
        if isinstance(then, dict) and isinstance(now[key], dict):
            out += _changed(then, now[key], resumable, name + ".")
        else:
            out.append((name, then, now[key]))
    return out


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first (an unfinished one has a temporary name and is never listed)."""
    root = out / "checkpoints"
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        m = CHECKPOINT_RE.match(d.name)
        if m and d.is_dir() and (d / "trainer_state.json").is_file():
            found.append((int(m.group(1)), d))
    return sorted(found)


class RunDirectory:
    """OUT, for a run with the given --resume / --overwrite and settings (recorded in the `kind`'s settings file)."""

    def __init__(self, out: Path, resume: bool, overwrite: bool, settings: dict[str, Any], kind: RunKind) -> None:
        self.out, self.resume, self.overwrite, self.settings, self.kind = out, resume, overwrite, settings, kind
        self.lock: RunLock | None = None  # held until the run ends
        self.replaced: Path | None = None  # the run --overwrite replaces, kept aside until the first checkpoint

    def lock_and_check(self, first: Callable[[], None] | None = None) -> None:
        """Lock OUT (a second run into it is refused, naming this one's pid), finish what an interrupted --overwrite
        left, and check OUT without changing anything: `first()` (the trainer's own check, `refuse_foreign`) before
        the generic one, so that an OUT holding something else is not told that --overwrite would do (with
        --resume, after it: "no run to resume" says more)."""
        self.lock = lock_run_directory(self.out, self.kind.command)
        self.recover_interrupted_overwrite()
        if first is not None and not self.resume:
            first()
        self.check()
        if first is not None and self.resume:
            first()

    def check(self) -> None:
        """Refuse, before anything is written: a file as OUT, another run in OUT without --resume or --overwrite,
        and --resume of a directory that holds no run (a mistyped --out is not a fresh start)."""
        out = self.out
        if out.exists() and not out.is_dir():
            raise BertforgeError(f"--out {out} exists and is not a directory")
        # hidden entries are not a run: the remains of an atomic write killed before the run recorded itself
        holds_files = out.is_dir() and any(not p.name.startswith(".") for p in out.iterdir())
        config = out / self.kind.config_file
        if self.resume:
            if not config.is_file():
                what = ("does not exist" if not out.exists() else "is empty" if not holds_files
                        else f"holds no {self.kind.what} (no {self.kind.config_file})")
                raise BertforgeError(
                    f"--resume: {out} {what}, so there is no run to resume (a mistyped --out?); leave out --resume "
                    f"to start a new run there"
                )
            self.check_resumable(config)
        elif holds_files and not self.overwrite and not self.kind.resume_option:
            held = f"a {self.kind.what}" if config.is_file() else "files (another run?)"
            raise BertforgeError(f"--out {out} already holds {held}; pass --overwrite to replace it")
        elif holds_files and not self.overwrite:
            raise BertforgeError(
                f"--out {out} already holds files (another run?); pass --resume to continue it or --overwrite to replace it"
            )

    def refuse_foreign(self) -> None:
        """OUT holding files but no run of this kind (no settings file of its kind) is refused, --overwrite or not:
        for trainers whose OUT is theirs alone (--overwrite would otherwise set aside only the entries it knows)."""
        out = self.out
        if (out / self.kind.config_file).is_file() or not out.is_dir():
            return
        if any(not p.name.startswith(".") for p in out.iterdir()):
            model = " (a model?)" if (out / "config.json").is_file() else ""
            raise BertforgeError(f"{out}: --out holds files that are not a bertforge {self.kind.what}{model}; choose "
                                 f"another directory (--overwrite replaces only a {self.kind.what})")

    def prepare(self) -> None:
        """The first change to OUT, once the run has been checked: --overwrite moves the previous run's entries into
        OUT/.replaced-run/ (renames, nothing deleted), where they stay until the new run has its first checkpoint
        (`drop_replaced`), and go back if it fails before (`abandon`); then the settings of the run are recorded."""
        out = self.out
        try:
            out.mkdir(parents=True, exist_ok=True)
            present = [name for name in self.kind.entries if (out / name).exists() or (out / name).is_symlink()]
            if self.overwrite and present:
                aside = out / REPLACED_DIR
                aside.mkdir()
                self.replaced = aside
                for name in present:
                    os.replace(out / name, aside / name)
                log.info("--overwrite: the previous run in %s is kept in %s until the new run's first checkpoint",
                         out, aside)
            for stale in (out / "checkpoints").glob(".step-*"):  # the remains of a save that was killed
                shutil.rmtree(stale, ignore_errors=True)
        except OSError as err:
            raise BertforgeError(f"--out {out}: cannot prepare it: {err.filename or out}: {err.strerror}") from None
        atomic_write_text(out / self.kind.config_file, json.dumps(self.settings, indent=2) + "\n")

    def recover_interrupted_overwrite(self) -> None:
        """An --overwrite killed before the new run's first checkpoint left the old run in OUT/.replaced-run/: put it
        back (the new run had nothing worth keeping). Killed after that checkpoint: the old run is no longer needed."""
        shutil.rmtree(self.out / f"{REPLACED_DIR}.deleting", ignore_errors=True)  # a kill inside drop_replaced
        aside = self.out / REPLACED_DIR
        if not aside.is_dir():
            return
        if list_checkpoints(self.out):
            shutil.rmtree(aside, ignore_errors=True)
            return
        self.replaced = aside
        self.restore_replaced()
        log.warning("%s: an interrupted --overwrite had set the previous run aside; it is back in place", self.out)

    def restore_replaced(self) -> None:
        """Put the run that --overwrite set aside back in OUT, removing what the new run wrote (rank 0)."""
        aside, self.replaced = self.replaced, None
        if aside is None or not aside.is_dir():
            return
        for name in self.kind.entries:
            target = self.out / name
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target, ignore_errors=True)
            elif target.exists() or target.is_symlink():
                target.unlink(missing_ok=True)
        for entry in aside.iterdir():
            os.replace(entry, self.out / entry.name)
        aside.rmdir()

    def drop_replaced(self) -> None:
        """The new run has a checkpoint: the run it replaces goes (rank 0, after the checkpoint is in place)."""
        aside, self.replaced = self.replaced, None
        if aside is not None:
            doomed = aside.with_name(f"{REPLACED_DIR}.deleting")  # one rename, so a kill never half-restores it
            shutil.rmtree(doomed, ignore_errors=True)
            os.replace(aside, doomed)
            shutil.rmtree(doomed, ignore_errors=True)

    def abandon(self) -> None:
        """After a failure: the run --overwrite set aside goes back in place, and the lock is released."""
        if self.replaced is not None:
            try:
                self.restore_replaced()
                log.warning("the run failed before its first checkpoint; the previous run in %s is back in place", self.out)
            except OSError as err:
                log.error("could not put the previous run back from %s: %s", self.out / REPLACED_DIR, err)
        self.close()

    def close(self) -> None:
        """Release the lock on OUT (the run is over, or this object will not run)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def check_resumable(self, previous: Path) -> None:
        settings = self.settings
        try:
            before = json.loads(previous.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise BertforgeError(f"{previous}: unreadable ({err})") from None
        unknown = sorted(set(before) - set(settings))
        if unknown:  # a setting renamed or removed since the run began: its value cannot be checked against it
            raise BertforgeError(f"--resume: {previous} records settings this version of bertforge does not have "
                                 f"({', '.join(unknown)}): the run was begun by an older version; start a new run")
        changed = _changed(before, settings, self.kind.resumable)
        if changed:
            details = ", ".join(f"{k}: {then!r} -> {now!r}" for k, then, now in changed)
            raise BertforgeError(f"--resume with settings that differ from the run in {self.out}: {details}")
