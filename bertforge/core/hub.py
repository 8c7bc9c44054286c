"""Models by name: a Hugging Face Hub id (`org/name`, `name`, with `@revision`) wherever a model directory is
taken, resolved to a directory through `huggingface_hub` — its cache first (`HF_HOME` / `HF_HUB_CACHE`; no network
when the snapshot is there), then a download where the network allows it (not with `HF_HUB_OFFLINE=1`).

A path that exists is always that path; an id that cannot be resolved gets one line saying what was tried.
Every loader and entry point calls `model_path`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import BertforgeError

# `name`, `org/name`, optionally `@revision`: what the Hub accepts as a model repository id (no `..`, no leading
# `/` or `.`, at most one `/`)
_HUB_ID = re.compile(r"^(?!.*\.\.)[A-Za-z0-9][\w.-]{0,95}(/[A-Za-z0-9][\w.-]{0,95})?(@[\w./-]+)?$")


def split_revision(name: str) -> tuple[str, str | None]:
    """`org/name@revision` → ("org/name", "revision"); no `@`: (name, None)."""
    repo, _, revision = name.partition("@")
    return repo, revision or None


def looks_like_hub_id(name: str) -> bool:
    return bool(_HUB_ID.match(name)) and not name.endswith((".json", ".safetensors", ".bin", ".txt"))


def model_path(model: str | os.PathLike[str], revision: str | None = None) -> Path:
    """The directory `model` names: itself when it exists (or is not a Hub id), else the Hub snapshot of that id
    (`revision`, or the id's `@revision`, or "main"), from the cache or downloaded."""
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
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # not in the cache: download, where the network and HF_HUB_OFFLINE allow
        pass
    try:
        return Path(snapshot_download(repo, revision=revision))
    except Exception as err:
        from huggingface_hub import constants

        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise BertforgeError(
            f"{model}: not a directory here, and not a model in the Hugging Face cache ({constants.HF_HUB_CACHE}"
            f"{', revision ' + revision if revision else ''}) or downloadable from the Hub ({reason[:160]})"
        ) from None


def model_reference(model: str | Path) -> str:
    """What a run records of the model it was given: an existing path made absolute, a Hub id as written (it is
    resolved again, from the cache, wherever the run is repeated)."""
    path = Path(model)
    return str(model) if not path.exists() and looks_like_hub_id(str(model)) else str(path.resolve())
