"""Training state (optimizer, scheduler, RNGs, data position) as JSON + safetensors: never a pickle.

`save_state(dir, name, obj)` splits any nest of dicts, lists, tuples, numbers, strings, tensors and numpy arrays
into `name.json` (the structure, with tensors replaced by references) and `name.safetensors` (the tensors).
`load_state` rebuilds the very same nest, so `torch.equal` holds for every tensor and dict key types survive.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .errors import BertforgeError


def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj))
        return {"__ndarray__": key}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a training state")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy()
        if "__tuple__" in obj:
            return tuple(_decode(v, tensors) for v in obj["__tuple__"])
        if "__dict__" in obj:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__dict__"]}
    return obj


def state_files(directory: Path, name: str) -> tuple[Path, Path]:
    return directory / f"{name}.json", directory / f"{name}.safetensors"


def save_state(directory: str | Path, name: str, obj: Any) -> None:
    """Write `obj` into `directory` (the caller makes the directory atomic: see `io.atomic_directory`)."""
    directory = Path(directory)
    tensors: dict[str, torch.Tensor] = {}
    structure = _encode(obj, tensors)
    json_file, tensor_file = state_files(directory, name)
    json_file.write_text(json.dumps(structure), encoding="utf-8")
    if tensors:
        save_file(tensors, str(tensor_file))


def load_state(directory: str | Path, name: str) -> Any:
    directory = Path(directory)
    json_file, tensor_file = state_files(directory, name)
    try:
        structure = json.loads(json_file.read_text(encoding="utf-8"))
        tensors = load_file(str(tensor_file)) if tensor_file.exists() else {}
        return _decode(structure, tensors)
    except FileNotFoundError:
        raise BertforgeError(f"{json_file}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, SafetensorError, KeyError, TypeError, ValueError,
            RecursionError) as err:
        raise BertforgeError(f"{directory}: state {name!r} is unreadable ({type(err).__name__}: {err})") from None


# ---------------------------------------------------------------------------------------------------- input files
# What a resumable run reads is recorded in its checkpoints and compared when it resumes: a corpus or a training
# file that changed would make the continuation another run. A file is known by its name (not its directory: a
# moved run resumes) and size, and, where reading all of it is cheap (fine-tuning's files), a digest of its bytes.


class DataChanged(BertforgeError):
    """A resume refused because the data differs from the checkpoint's (not a damaged checkpoint: an older one
    would differ alike). `file`: the position of the first file that differs among those recorded, when known (a
    caller that handed the trainer files of its own making names its user's file from it)."""

    def __init__(self, message: str, file: int | None = None) -> None:
        super().__init__(message)
        self.file = file


def files_fingerprint(paths: list[str | Path] | list[Path], digest: bool = False) -> list[list[Any]]:
    """[name, size] of each file (size -1 when unreadable), with the BLAKE2b digest of its bytes when `digest`."""
    out: list[list[Any]] = []
    for path in map(Path, paths):
        try:
            entry: list[Any] = [path.name, path.stat().st_size]
            if digest:
                entry.append(hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest())
        except OSError:
            entry = [path.name, -1] + (["unreadable"] if digest else [])
        out.append(entry)
    return out


def check_same_files(then: list[list[Any]], now: list[list[Any]], what: str) -> None:
    """Refuse to resume when the files recorded in a checkpoint (`then`) and the files now (`now`) differ."""
    then, now = [list(f) for f in then], [list(f) for f in now]
    if then == now:
        return

    def describe(entry: list[Any] | None, other: list[Any] | None) -> str:
        if entry is None:
            return "nothing"
        text = f"{entry[0]} ({entry[1]:,} bytes"
        if len(entry) > 2 and other is not None and entry[:2] == other[:2]:  # same name and size, other bytes
            text += f", contents {str(entry[2])[:8]}"
        return text + ")"

    at = next((i for i, (a, b) in enumerate(zip(then, now, strict=False)) if a != b), min(len(then), len(now)))
    was, is_ = (then[at] if at < len(then) else None), (now[at] if at < len(now) else None)
    raise DataChanged(
        f"cannot resume: the {what} differs from the checkpoint's ({len(then)} file{'s' if len(then) != 1 else ''} "
        f"then, {len(now)} now; file {at + 1} was {describe(was, is_)}, is {describe(is_, was)}); resume with the data "
        f"the run started with, or start a new run", file=at)
