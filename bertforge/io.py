"""Atomic file and directory writes: a crash, a full disk or a kill never leaves a half-written file behind.

Each writer puts its bytes into a temporary name beside the target, fsyncs them, then renames over the target
(`os.replace` is atomic on POSIX). A whole directory (a training checkpoint) is built under a temporary name and
renamed into place in one step.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import BertforgeError


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


def _describe(err: OSError, target: Path) -> BertforgeError:
    reason = err.strerror or str(err)
    return BertforgeError(f"cannot write {target}: {reason}")


def atomic_write(target: str | Path, write: Callable[[Path], None]) -> None:
    """Call `write(tmp_path)` and move the result to `target` atomically; on failure `target` is untouched."""
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise _describe(err, target) from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise _describe(err, target) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    atomic_write(target, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(target: str | Path, text: str) -> None:
    atomic_write_bytes(target, text.encode("utf-8"))


@contextlib.contextmanager
def atomic_directory(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success it replaces `target` in one rename.

    On any error the temporary directory is removed and `target` (if it existed) is left as it was.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    except OSError as err:
        raise _describe(err, target) from None
    try:
        yield tmp
        for file in tmp.rglob("*"):
            if file.is_file():
                with open(file, "rb+") as fh:
                    os.fsync(fh.fileno())
        fsync_dir(tmp)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _describe(err, target) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
