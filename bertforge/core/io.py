"""Atomic file and directory writes: a crash, a full disk or a kill never leaves a half-written file behind.

Each writer puts its bytes into a temporary name beside the target, fsyncs them, then renames over the target
(`os.replace` is atomic on POSIX). A whole directory (a training checkpoint) is built under a temporary name and
renamed into place in one step; one that replaces an existing directory is swapped with it in one step too
(Linux's `renameat2(RENAME_EXCHANGE)`), so the target name always holds a complete directory, the old or the new.
A temporary name says whose it is (`.NAME.HOST-PID.XXXXXXXX.tmp`): a writer killed mid-save leaves its temporary
file, and the next write of the same name on that host removes those whose process is gone (`sweep_stale`).

Also here, for every layer: the run-directory lock (`lock_run_directory`), JSON lines (`json_line`, `json_object`)
and the check that an input file is text (`check_text`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any
from pathlib import Path

from .errors import BertforgeError

try:  # safetensors' writer reports a full disk or a failed write as SafetensorError, not OSError
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - safetensors is a dependency
    _SafetensorError = OSError  # type: ignore[misc, assignment]

# What a failed write raises; each becomes a BertforgeError naming the target.
WRITE_ERRORS: tuple[type[Exception], ...] = (OSError, _SafetensorError)


def json_object(text: str | bytes, where: str) -> dict[str, Any]:
    """One line of a JSONL file as a dict; `where` ("FILE:LINE") names it in the error."""
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise BertforgeError(f"{where}: not valid JSON ({err.msg})") from None
    if not isinstance(record, dict):
        raise BertforgeError(f"{where}: expected a JSON object, got {type(record).__name__}")
    return record



def json_line(record: Any) -> str:
    """`record` as one line of JSON (and its line end) that can always be written as UTF-8: text as it is, except
    that a record holding a lone surrogate (valid JSON input such as "\\ud800" reads back as one) is written with
    every non-ASCII character escaped, so it reads back as the same string instead of failing the write."""
    line = json.dumps(record, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(record, ensure_ascii=True)
    return line + "\n"


# ---------------------------------------------------------------------------------------------------- output paths


def _same_file(a: Path, b: Path) -> bool:
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)  # a hard link, or another spelling of a path that exists
    except OSError:
        return False


def check_output_file(output: str | Path, *, inputs: tuple[str | Path | None, ...] = (),
                      model: str | Path | None = None, option: str = "--out") -> None:
    """Refuse an output file that would replace what the command reads: one of its `inputs`, or a file inside the
    `model` directory (its config.json, its weights). Checked before anything is read, so nothing is written."""
    out = Path(output)
    for given in inputs:
        if given is not None and _same_file(out, Path(given)):
            raise BertforgeError(f"{option} {out} is the input file {given}: writing it would replace the data it is "
                                 f"made from; choose another file")
    if model is not None:
        directory = Path(model)
        if directory.is_dir() and (_same_file(out, directory) or out.resolve().is_relative_to(directory.resolve())):
            raise BertforgeError(f"{option} {out} is inside the model directory {directory}: writing it would damage "
                                 f"the model; choose a file outside it")


# ---------------------------------------------------------------------------------------------------- text or binary
# Every reader of text (corpora, task files, embed input) calls `check_text` on a file's first bytes before reading
# it, so that a binary file (a program, an archive, an image, UTF-16 text) is refused instead of being read as
# text made of replacement characters.

TEXT_SAMPLE_BYTES = 64 << 10  # how much of the start of a file is looked at
BINARY_SHARE = 0.30  # more than this share of suspicious characters in the sample: not text
# C0 controls other than tab, line feed, vertical tab, form feed and carriage return; DEL and the C1 controls;
# U+FFFD (text that already went through a lossy conversion); U+DC80-U+DCFF (bytes that are not UTF-8, as the
# "surrogateescape" decoding leaves them, one per byte).
_SUSPICIOUS = re.compile("[\x00-\x08\x0e-\x1f\x7f-\x9f\ufffd\udc80-\udcff]")


def binary_reason(head: bytes, truncated: bool = False) -> str | None:
    """Why `head`, the first bytes of a file, look binary rather than UTF-8 text; None when they look like text.

    Not text: a UTF-16/UTF-32 byte-order mark, any NUL byte, or more than `BINARY_SHARE` of the characters being
    control characters (tab and line ends excepted), U+FFFD or bytes that are not UTF-8. `truncated`: `head` is a
    prefix of the file, so a multi-byte character cut at its end is not counted.
    """
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16 or UTF-32 text (it starts with a byte-order mark FF FE or FE FF); convert it to UTF-8"
    nul = head.find(b"\x00")
    if nul >= 0:
        return f"a NUL byte at offset {nul}"
    if truncated:  # drop a trailing, possibly incomplete, multi-byte sequence
        i = len(head) - 1
        while i > 0 and len(head) - i < 4 and head[i] & 0xC0 == 0x80:
            i -= 1
        if i >= 0 and head[i] >= 0xC0:
            head = head[:i]
    text = head.decode("utf-8", "surrogateescape")
    if not text:
        return None
    bad = len(_SUSPICIOUS.findall(text))
    if bad > BINARY_SHARE * len(text):
        return (f"{bad / len(text):.0%} of the first {len(head):,} bytes are control characters or not UTF-8 "
                f"(a binary file, or text in another encoding)")
    return None


def read_head(path: str | Path, size: int = TEXT_SAMPLE_BYTES) -> tuple[bytes, bool]:
    """The first `size` bytes of a file (decompressed for `.gz`) and whether the file goes on after them."""
    import gzip
    import zlib

    path = Path(path)
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as fh:
            head = fh.read(size + 1)
    except (OSError, EOFError, zlib.error) as err:
        reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
        raise BertforgeError(f"{path}: cannot read it ({reason})") from None
    return head[:size], len(head) > size


def check_text(path: str | Path, head: bytes | None = None, truncated: bool = False, hint: str = "") -> None:
    """Raise a `BertforgeError` naming `path` when its first bytes are not text (see `binary_reason`). `head`: those
    bytes when the caller has already read them (else they are read here); `hint`: how to override, for the
    message."""
    if head is None:
        head, truncated = read_head(path)
    else:
        truncated = truncated or len(head) > TEXT_SAMPLE_BYTES
        head = head[:TEXT_SAMPLE_BYTES]
    reason = binary_reason(head, truncated)
    if reason is not None:
        raise BertforgeError(f"{path}: not a text file: {reason}{'; ' + hint if hint else ''}")


def _current_umask() -> int:
    try:  # Linux: read it without changing it (os.umask both sets and gets, racing with other threads)
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _publish_mode(path: Path, directory: bool) -> None:
    """`mkstemp`/`mkdtemp` create 0600/0700; give the result the mode a plain `open`/`mkdir` would have."""
    try:
        os.chmod(path, (0o777 if directory else 0o666) & ~_current_umask())
    except OSError:  # a filesystem without POSIX modes: the file is still good
        pass


def fsync_dir(path: str | Path) -> None:
    """Make a rename inside `path` durable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _describe(err: Exception, target: Path) -> BertforgeError:
    reason = (err.strerror if isinstance(err, OSError) else None) or str(err)
    return BertforgeError(f"cannot write {target}: {reason}")


_HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"  # as it goes into a file name


def temp_prefix(name: str) -> str:
    """The start of a temporary name for `name` (mkstemp/mkdtemp add a random part and `.tmp`): who writes it."""
    return f".{name}.{_HOST}-{os.getpid()}."


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: a process of another user has that pid
        return True
    return True


def sweep_stale(directory: Path, name: str | None = None) -> int:
    """Remove the temporary files (or directories) for `name` (None: for any name) in `directory` that writers of
    this host left when they died (a SIGKILL mid-save): those whose pid is no longer a process. Another host's, a
    live process's and those a pending `atomic_write_files` still needs are left. Returns how many went."""
    if (directory / PENDING_WRITES).exists():  # its temporary files are the next reader's to rename
        return 0
    named = ".+" if name is None else re.escape(name)
    stale = re.compile(rf"\.{named}\.{re.escape(_HOST)}-(\d+)\.[^/.]*\.tmp")
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        match = stale.fullmatch(entry.name)
        if match is None or int(match.group(1)) == os.getpid() or _alive(int(match.group(1))):
            continue
        _remove(Path(entry.path))
        removed += 1
    return removed


def atomic_write(target: str | Path, write: Callable[[Path], object]) -> None:
    """Call `write(tmp_path)` and move the result to `target` atomically; on failure `target` is untouched."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(target.parent, target.name)
        fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise _describe(err, target) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        _publish_mode(tmp, directory=False)  # after: a writer may have replaced the file
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except WRITE_ERRORS as err:
        tmp.unlink(missing_ok=True)
        raise _describe(err, target) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


#: In a directory `atomic_write_files` is writing: the renames still to do, written once every new file is complete
#: and fsynced, removed after the last rename. A kill between the renames leaves it, and the next write or read of
#: the directory finishes them (`finish_pending_writes`), so the set of files is never a mix of two writes.
PENDING_WRITES = ".bertforge-pending.json"


def atomic_write_files(directory: str | Path, writers: dict[str, Callable[[Path], object]]) -> None:
    """Write several files of `directory` so that a failure leaves all of them as they were, and a kill leaves them
    all old or, once the next reader or writer finishes the renames, all new.

    Every `writers[name](tmp_path)` runs (and is fsynced) before the first rename, so a full disk or a failed
    write changes nothing; then the renames are recorded (`PENDING_WRITES`) before they are made, so that a kill
    between them is completed by `finish_pending_writes` instead of leaving new files beside old ones.
    """
    directory = Path(directory)
    staged: list[tuple[Path, Path]] = []
    current = directory
    journaled = False
    try:
        directory.mkdir(parents=True, exist_ok=True)
        finish_pending_writes(directory)  # a write killed between its renames: its files first
        for name, write in writers.items():
            current = directory / name
            sweep_stale(directory, name)
            fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(name), suffix=".tmp", dir=directory)
            os.close(fd)
            staged.append((Path(tmp_name), current))
            write(Path(tmp_name))
            _publish_mode(Path(tmp_name), directory=False)
            with open(tmp_name, "rb+") as fh:
                os.fsync(fh.fileno())
        if len(staged) > 1:
            current = directory / PENDING_WRITES
            atomic_write_text(current, json.dumps([[tmp.name, target.name] for tmp, target in staged]))
            journaled = True
        for tmp, target in staged:
            current = target
            os.replace(tmp, target)
        if journaled:
            (directory / PENDING_WRITES).unlink()
    except WRITE_ERRORS as err:
        raise _describe(err, current) from None
    finally:
        if not journaled or not (directory / PENDING_WRITES).exists():  # a journal's files are the next reader's
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)
    fsync_dir(directory)


def finish_pending_writes(directory: str | Path) -> None:
    """Make the renames an `atomic_write_files` into `directory` recorded but was killed before finishing (its new
    files are complete: the record is written after them), so that the directory holds that write's files whole.
    Nothing to do (the usual case) costs one failed open; a directory this process cannot write is left as it is."""
    journal = Path(directory) / PENDING_WRITES
    try:
        pairs = json.loads(journal.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        return
    except (OSError, ValueError):
        return
    try:
        for tmp, target in pairs if isinstance(pairs, list) else []:
            source = journal.parent / str(tmp)
            if source.is_file() and "/" not in str(target):
                os.replace(source, journal.parent / str(target))
        journal.unlink()
        fsync_dir(journal.parent)
    except OSError:
        pass


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(target: str | Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _load_renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.3
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def exchange_paths(a: str | Path, b: str | Path) -> bool:
    """Swap the entries `a` and `b` (both must exist) in one atomic step: Linux's `renameat2(RENAME_EXCHANGE)`.

    Returns False, having changed nothing, where that is not available (not Linux, a libc or kernel without
    renameat2, a filesystem without RENAME_EXCHANGE); raises OSError if the exchange itself fails.
    """
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it takes the place of `target` in one atomic step.

    An existing `target` is exchanged with the new directory in one step where the system can (Linux's
    `renameat2(RENAME_EXCHANGE)`), then removed: whenever the process dies, `target` is a complete directory, the
    old one or the new. Elsewhere it takes two renames (old aside, new in), and a kill between them leaves no
    `target`, only the old directory beside it as `.NAME.old-PID`.

    On any error the temporary directory is removed and `target` (if it existed) is left as it was.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(target.parent, target.name)
        tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(target.name), suffix=".tmp", dir=target.parent))
    except OSError as err:
        raise _describe(err, target) from None
    old = None
    try:
        _publish_mode(tmp, directory=True)
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb+") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        if target.exists() and exchange_paths(tmp, target):
            fsync_dir(target.parent)
            _remove(tmp)  # now the old directory
            return
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except WRITE_ERRORS as err:
        _undo(tmp, old, target)
        raise _describe(err, target) from None
    except BaseException:
        _undo(tmp, old, target)
        raise


def _undo(tmp: Path, old: Path | None, target: Path) -> None:
    """After a failed `atomic_directory`: drop the new directory and put the previous `target` back."""
    shutil.rmtree(tmp, ignore_errors=True)
    if old is not None and old.exists() and not target.exists():
        try:
            os.replace(old, target)
        except OSError:
            pass


# ---------------------------------------------------------------------------------------------------- run locks
def run_lock_path(out: str | Path) -> Path:
    """The lock file of the run directory `out`: `.NAME.lock` beside it, not inside, so that it outlives the
    atomic exchanges of `out` itself (finetune's `out` appears only at the end; `--overwrite` moves it aside)."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


class RunLock:
    """An exclusive advisory lock (`fcntl.flock`) on a run directory, held until `release()` or the process's death
    (the kernel drops it then, so a killed run never leaves a stale lock). The lock file holds the holder's pid."""

    def __init__(self, out: Path, path: Path, fd: int) -> None:
        self.out, self.path, self.fd = out, path, fd

    def release(self) -> None:
        if self.fd < 0:
            return
        if _HELD.get(self.path) is self:
            del _HELD[self.path]
        with contextlib.suppress(OSError):
            os.unlink(self.path)  # while still held: a process waiting on this inode sees it is gone and retries
        os.close(self.fd)
        self.fd = -1

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if self.fd >= 0:  # an abandoned holder: the lock goes with it
            with contextlib.suppress(Exception):
                self.release()


_HELD: dict[Path, RunLock] = {}  # the locks this process holds, by lock file


def lock_run_directory(out: str | Path, command: str = "run") -> RunLock:
    """Take the exclusive lock on the run directory `out`, or refuse with a BertforgeError naming the pid of the run
    that holds it. Every command that writes a run directory takes it before it changes anything there."""
    import fcntl

    out = Path(out)
    path = run_lock_path(Path(os.path.abspath(out)))
    held = _HELD.get(path)
    if held is not None and held.fd >= 0:
        # This process already holds it (an earlier trainer object on the same directory that was never closed):
        # the new holder takes it over. Exclusion is between processes, where two runs would write at once.
        lock = RunLock(out, path, held.fd)
        held.fd = -1
        _HELD[path] = lock
        return lock
    while True:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise BertforgeError(f"cannot lock {out}: cannot create {path}: {err.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            try:
                holder = os.pread(fd, 64, 0).decode("ascii", "replace").split()
            except OSError:
                holder = []
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = holder[0] if holder else "unknown"
                what = holder[1] if len(holder) > 1 else "run"
                raise BertforgeError(
                    f"{out} is in use by another bertforge {what} (pid {pid}; lock file {path}); wait for it to "
                    f"end or choose another --out"
                ) from None
            raise BertforgeError(f"cannot lock {out}: {path}: {err.strerror}") from None
        try:  # the file may have been unlinked by a holder releasing it between our open and flock: retry then
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {command}\n".encode("ascii"), 0)
        except OSError as err:
            os.close(fd)
            raise BertforgeError(f"cannot lock {out}: cannot write {path}: {err.strerror}") from None
        lock = _HELD[path] = RunLock(out, path, fd)
        return lock
