"""Models by name: a Hugging Face Hub id (`org/name`, `name`, with `@revision`) wherever a model directory is
taken, resolved to a directory through `huggingface_hub` — its cache first (`HF_HOME` / `HF_HUB_CACHE`; no network
when the snapshot is there), then a download where the network allows it (not with `HF_HUB_OFFLINE=1`).

A path that exists is always that path; an id that cannot be resolved gets one line saying what was tried.
Every loader and entry point calls `model_path`; a cached snapshot missing files is downloaded again, or named as
incomplete. A run records a Hub id pinned to the commit it resolved to (`model_reference`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .constants import PICKLE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME
from .errors import BertforgeError

# `name`, `org/name`, optionally `@revision`: what the Hub accepts as a model repository id (no `..`, no leading
# `/` or `.`, at most one `/`)
_HUB_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?(@[\w./-]+)?$")


_COMMIT = re.compile(r"^[0-9a-f]{40}$")  # a snapshot directory's name in the Hub cache: the commit's hash


def split_revision(name: str) -> tuple[str, str | None]:
    """`org/name@revision` → ("org/name", "revision"); no `@`: (name, None)."""
    repo, _, revision = name.partition("@")
    return repo, revision or None


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not name.endswith((".json", ".safetensors", ".bin", ".txt"))


def model_path(model: str | os.PathLike[str], revision: str | None = None, *, weights: bool = True) -> Path:
    """The directory `model` names: itself when it exists (or is not a Hub id), else the Hub snapshot of that id
    (`revision`, or the id's `@revision`, or "main"), from the cache or downloaded.

    A cached snapshot that is incomplete (`incomplete_snapshot`: a dangling link left by an interrupted download,
    or, when `weights`, a model's config.json without its weights, as a config-only download leaves it) is not used
    as it is: the download is tried, and where it fails, one line says the copy is incomplete. `weights=False`
    (a config or a tokenizer is all the caller reads) takes a snapshot without weights."""
    path = Path(model)
    if path.exists() or not looks_like_hub_id(str(model)):
        return path
    repo, at = split_revision(str(model))
    revision = revision or at
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - a core dependency
        raise BertforgeError(f"{model}: no such directory (and huggingface_hub, which resolves Hub ids, is not "
                             "installed)") from None
    cached, problem = None, None
    try:
        cached = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # not in the cache: download, where the network and HF_HUB_OFFLINE allow
        pass
    if cached is not None:
        problem = incomplete_snapshot(cached, weights)
        if problem is None:
            return cached
    from huggingface_hub import constants

    try:
        downloaded = Path(snapshot_download(repo, revision=revision))
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if cached is not None:
            raise _incomplete(model, cached, problem, reason) from None
        raise BertforgeError(
            f"{model}: not a directory here, and not a model in the Hugging Face cache ({constants.HF_HUB_CACHE}"
            f"{', revision ' + revision if revision else ''}) or downloadable from the Hub ({reason[:160]})"
        ) from None
    problem = incomplete_snapshot(downloaded, weights)
    if problem is not None:  # offline, huggingface_hub answers with the cached copy as it is
        raise _incomplete(model, downloaded, problem, "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
                          else "the Hub's copy lacks it too")
    return downloaded


def _incomplete(model: object, snapshot: Path, problem: str | None, reason: str) -> BertforgeError:
    return BertforgeError(f"{model}: the copy in the Hugging Face cache ({snapshot}) is incomplete ({problem}), and "
                          f"downloading it failed ({reason[:160]}); download it again where the Hub is reachable")


def incomplete_snapshot(directory: Path, weights: bool = True) -> str | None:
    """Why the Hub snapshot `directory` cannot be used as it is, or None: a dangling link (its blob missing, as an
    interrupted download or a cleaned cache leaves it) and, when `weights`, a model (config.json) without weights
    or with shards its index lists missing."""
    dangling = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_symlink() and not p.exists())
    if dangling:
        return f"{', '.join(dangling[:3])}{' ...' if len(dangling) > 3 else ''}: a link to a missing file"
    if not weights or not (directory / "config.json").is_file():
        return None
    index = directory / WEIGHTS_INDEX_NAME
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # a damaged index is the loader's to report, naming the file
        missing = [s for s in shards if not (directory / str(s)).is_file()]
        return f"shards {', '.join(missing[:3])} of {WEIGHTS_INDEX_NAME} missing" if missing else None
    if not any((directory / name).is_file() for name in (WEIGHTS_NAME, PICKLE_WEIGHTS_NAME)):
        return f"config.json without weights: no {WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} or {PICKLE_WEIGHTS_NAME}"
    return None


def pin_revision(model: str) -> str:
    """A Hub id pinned to the commit it resolves to now (`org/name@<commit>`), so that a run repeated or resumed
    later loads the same weights even after the branch or tag moved; a path, or an id that does not resolve to a
    snapshot (the loader then says why in one line), is returned as it is."""
    if Path(model).exists() or not looks_like_hub_id(model):
        return model
    try:
        snapshot = model_path(model)
    except BertforgeError:
        return model
    if snapshot.parent.name != "snapshots" or not _COMMIT.match(snapshot.name):
        return model
    return f"{split_revision(model)[0]}@{snapshot.name}"


def model_reference(model: str | Path) -> str:
    """What a run records of the model it was given: an existing path made absolute, a Hub id pinned to the commit
    it resolves to (`pin_revision`), so that `--resume` and `--run-config` load the same weights, and a resume after
    the ref moved is refused as a changed setting."""
    path = Path(model)
    return pin_revision(str(model)) if not path.exists() and looks_like_hub_id(str(model)) else str(path.resolve())
