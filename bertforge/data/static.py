"""Static masking (the original BERT recipe): write masked instances to disk once, ``dupe_factor`` times over.

``write_static_shards(stream, out_dir, dupe_factor, shard_size)`` runs a :class:`PretrainingStream` for
``dupe_factor`` epochs (each epoch has its own sentence pairs and its own masks) and writes what it yields, in
order, to ``out_dir/shard-00000.safetensors``, ... (``shard_size`` instances each, never more than one shard in
memory) plus ``out_dir/index.json``. Each shard holds, padded to ``max_seq_length``: ``input_ids`` (int32, already
masked), ``token_type_ids`` (uint8), ``labels`` (int32, -100 where nothing is predicted), ``lengths`` (int32) and,
with NSP or SOP, ``next_sentence_label`` (int8). No pickle anywhere. The index records the stream's
``sentence_objective`` ("nsp", "sop" or null), its ``nsp`` flag as before (true only for "nsp"), ``masking`` and
``max_ngram``; :func:`index_sentence_objective` reads the objective back, also from an older index that has
only ``nsp``.

``write_duplicated_shards(make_stream, out_dir, dupe_factor, shard_size)`` is the recipe of BERT's
``create_pretraining_data.py`` as RoBERTa describes it: one pass of instances, each masked ``dupe_factor``
different ways (``make_stream()`` is called once per duplicate and must build the same stream; the masking
generator carries on from one duplicate to the next, so the instances repeat and the masks do not).

:class:`StaticShardReader` iterates batches over such a directory, forever (or ``max_epochs``), with a shuffled
shard order and a shuffled row order per shard and epoch; rank ``r`` of ``w`` takes every ``w``-th row of each
shuffled shard. Its position (epoch, shard, row) is its :meth:`~StaticShardReader.state_dict`.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from bertforge.core.constants import IGNORE_INDEX
from bertforge.data.instances import derive_seed
from bertforge.data.stream import PretrainingStream
from bertforge.core.errors import BertforgeError

INDEX_NAME = "index.json"
FORMAT = "bertforge-static-mlm"


def _pad_rows(array: np.ndarray, length: int, value: int) -> np.ndarray:
    if array.shape[1] == length:
        return array
    out = np.full((array.shape[0], length), value, dtype=array.dtype)
    out[:, : array.shape[1]] = array
    return out


class _ShardWriter:
    """Appends masked batches to ``shard-NNNNN.safetensors`` files of ``shard_size`` rows (one shard in memory)."""

    def __init__(self, out: Path, length: int, pad_id: int, shard_size: int, progress: bool = False, desc: str = "") -> None:
        self.out, self.length, self.pad_id, self.shard_size = out, length, pad_id, shard_size
        self.shards: list[dict[str, Any]] = []
        self.parts: dict[str, list[np.ndarray]] = {}
        self.held = 0
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=desc or "writing static shards", unit="inst", dynamic_ncols=True)

    def flush(self) -> None:
        if not self.held:
            return
        arrays = {key: np.concatenate(chunks) for key, chunks in self.parts.items()}
        name = f"shard-{len(self.shards):05d}.safetensors"
        save_file(arrays, str(self.out / name))
        self.shards.append({"file": name, "count": int(self.held)})
        self.parts, self.held = {}, 0

    def add(self, batch: dict[str, Any]) -> None:
        length, pad_id = self.length, self.pad_id
        mask = batch["attention_mask"].numpy()
        rows = {
            "input_ids": _pad_rows(batch["input_ids"].numpy().astype(np.int32), length, pad_id),
            "token_type_ids": _pad_rows(batch["token_type_ids"].numpy().astype(np.uint8), length, 0),
            "labels": _pad_rows(batch["labels"].numpy().astype(np.int32), length, IGNORE_INDEX),
            "lengths": mask.sum(axis=1).astype(np.int32),
        }
        if "next_sentence_label" in batch:
            rows["next_sentence_label"] = batch["next_sentence_label"].numpy().astype(np.int8)
        n = len(mask)
        pos = 0
        while pos < n:
            take = min(n - pos, self.shard_size - self.held)
            for key, value in rows.items():
                self.parts.setdefault(key, []).append(value[pos : pos + take])
            self.held += take
            pos += take
            if self.held == self.shard_size:
                self.flush()
        if self.bar is not None:
            self.bar.update(n)

    def finish(self, **fields: Any) -> dict[str, Any]:
        self.flush()
        if self.bar is not None:
            self.bar.close()
        if not self.shards:
            raise BertforgeError("the stream produced no instances to write")
        index = {
            "format": FORMAT,
            "version": 1,
            "max_seq_length": self.length,
            "pad_id": self.pad_id,
            **fields,
            "total": sum(s["count"] for s in self.shards),
            "shards": self.shards,
        }
        tmp = self.out / (INDEX_NAME + ".tmp")
        tmp.write_text(json.dumps(index, indent=1), encoding="utf-8")
        tmp.replace(self.out / INDEX_NAME)
        return index


def _stream_fields(stream: PretrainingStream) -> dict[str, Any]:
    """What an index records about the stream that wrote it."""
    collator = stream.collator
    return {
        "nsp": stream.nsp,
        "sentence_objective": stream.sentence_objective,
        "masking": collator.masking,
        "max_ngram": collator.max_ngram if collator.masking == "ngram" else None,
    }


def index_sentence_objective(index: dict[str, Any]) -> str | None:
    """The sentence objective ("nsp", "sop" or None) of the shards an index describes; an index written before
    SOP existed has only ``nsp``."""
    if "sentence_objective" in index:
        return index["sentence_objective"]
    return "nsp" if index.get("nsp") else None


def _check_output(out_dir: str | os.PathLike, dupe_factor: int, shard_size: int) -> Path:
    if dupe_factor < 1:
        raise BertforgeError(f"dupe_factor must be at least 1 (got {dupe_factor})")
    if shard_size < 1:
        raise BertforgeError(f"shard_size must be at least 1 (got {shard_size})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if (out / INDEX_NAME).exists():
        raise BertforgeError(f"{out} already holds static shards ({INDEX_NAME}); choose an empty directory")
    return out


def write_static_shards(
    stream: PretrainingStream, out_dir: str | os.PathLike, dupe_factor: int = 5, shard_size: int = 100_000,
    progress: bool = False,
) -> dict[str, Any]:
    """Write ``dupe_factor`` epochs of masked instances from ``stream`` (consumed) as shards; returns the index."""
    out = _check_output(out_dir, dupe_factor, shard_size)
    start = stream.instances.epoch if stream.instances.docs_processed else 0
    stream.instances.max_epochs = start + dupe_factor
    writer = _ShardWriter(out, stream.max_seq_length, stream.collator.pad_id, shard_size, progress)
    for batch in stream:
        writer.add(batch)
    return writer.finish(**_stream_fields(stream), dupe_factor=dupe_factor, stats=stream.stats)


def write_duplicated_shards(
    make_stream: Callable[[], PretrainingStream],
    out_dir: str | os.PathLike,
    dupe_factor: int = 10,
    shard_size: int = 100_000,
    progress: bool = False,
) -> dict[str, Any]:
    """One epoch of ``make_stream()``'s instances, masked ``dupe_factor`` different ways, as shards; returns the index.

    ``make_stream`` is called once per duplicate and must return the same fresh stream each time (same corpus,
    settings and seed): each pass yields the same instances, in the same order, while the masking generator goes on
    from where the previous pass left it. Memory stays at one shard whatever the corpus size.
    """
    out = _check_output(out_dir, dupe_factor, shard_size)
    writer = None
    masking = None
    fields: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    per_pass: list[int] = []
    for dupe in range(dupe_factor):
        stream = make_stream()
        try:
            if stream.instances.docs_processed:
                raise BertforgeError("write_duplicated_shards needs a fresh stream from make_stream()")
            stream.instances.max_epochs = 1
            if masking is not None:
                stream.collator.load_state_dict(masking)
            if writer is None:
                desc = f"static masking ({dupe_factor} duplicates)"
                writer = _ShardWriter(out, stream.max_seq_length, stream.collator.pad_id, shard_size, progress, desc)
            before = sum(s["count"] for s in writer.shards) + writer.held
            for batch in stream:
                writer.add(batch)
            per_pass.append(sum(s["count"] for s in writer.shards) + writer.held - before)
            if dupe == 0 and writer.bar is not None:
                writer.bar.total = per_pass[0] * dupe_factor
                writer.bar.refresh()
            masking = stream.collator.state_dict()
            fields, stats = _stream_fields(stream), stream.stats
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if per_pass[-1] != per_pass[0]:
            raise BertforgeError(
                f"duplicate {dupe + 1} of the stream made {per_pass[-1]} instances, the first {per_pass[0]}: "
                "make_stream() must build the same stream every time"
            )
    assert writer is not None
    return writer.finish(**fields, dupe_factor=dupe_factor, same_instances=True, stats=stats)


class StaticShardReader:
    """Batches (dicts of torch tensors, padded to the longest in the batch) from a static shard directory."""

    def __init__(
        self,
        directory: str | os.PathLike,
        batch_size: int = 32,
        *,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        max_epochs: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        index_path = self.directory / INDEX_NAME
        if not index_path.is_file():
            raise BertforgeError(f"{self.directory} is not a static shard directory (no {INDEX_NAME})")
        try:
            self.index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise BertforgeError(f"{index_path}: cannot read it: {err}") from None
        if self.index.get("format") != FORMAT:
            raise BertforgeError(f"{index_path}: not a {FORMAT} index")
        if world_size < 1 or not 0 <= rank < world_size:
            raise BertforgeError(f"rank {rank} is not in range for world_size {world_size}")
        if batch_size < 1:
            raise BertforgeError(f"batch_size must be at least 1 (got {batch_size})")
        self.batch_size = batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.shuffle = shuffle
        self.max_epochs = max_epochs
        self.pad_id = int(self.index["pad_id"])
        self.sentence_objective = index_sentence_objective(self.index)  # "nsp", "sop" or None
        self.epoch = 0
        self.shard_pos = 0  # position in this epoch's shard order
        self.row_pos = 0  # position in this rank's rows of that shard
        self._loaded: tuple[tuple[int, int], dict[str, np.ndarray], list[int]] | None = None

    def _shard_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.index["shards"])))
        if self.shuffle:
            random.Random(derive_seed(self.seed, epoch, "shard-order")).shuffle(order)
        return order

    def _rows(self, epoch: int, shard: int) -> tuple[dict[str, np.ndarray], list[int]]:
        key = (epoch, shard)
        if self._loaded is None or self._loaded[0] != key:
            info = self.index["shards"][shard]
            path = self.directory / info["file"]
            try:
                arrays = load_file(str(path))
            except Exception as err:
                raise BertforgeError(f"{path}: cannot read shard: {err}") from None
            rows = list(range(int(info["count"])))
            if self.shuffle:
                random.Random(derive_seed(self.seed, epoch, shard, "rows")).shuffle(rows)
            self._loaded = (key, arrays, rows[self.rank :: self.world_size])
        return self._loaded[1], self._loaded[2]

    def __iter__(self) -> StaticShardReader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        picked: list[tuple[dict[str, np.ndarray], int]] = []
        while len(picked) < self.batch_size:
            if self.max_epochs is not None and self.epoch >= self.max_epochs:
                break
            order = self._shard_order(self.epoch)
            if self.shard_pos >= len(order):
                self.epoch += 1
                self.shard_pos = self.row_pos = 0
                continue
            arrays, rows = self._rows(self.epoch, order[self.shard_pos])
            if self.row_pos >= len(rows):
                self.shard_pos += 1
                self.row_pos = 0
                continue
            take = rows[self.row_pos : self.row_pos + self.batch_size - len(picked)]
            picked.extend((arrays, r) for r in take)
            self.row_pos += len(take)
        if not picked:
            raise StopIteration
        lengths = [int(arrays["lengths"][r]) for arrays, r in picked]
        width = max(lengths)
        batch: dict[str, Any] = {}
        for key, dtype in (("input_ids", torch.long), ("token_type_ids", torch.long), ("labels", torch.long)):
            batch[key] = torch.from_numpy(np.stack([a[key][r, :width] for a, r in picked]).astype(np.int64)).to(dtype)
        batch["attention_mask"] = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).long()
        if "next_sentence_label" in picked[0][0]:
            batch["next_sentence_label"] = torch.tensor(
                [int(a["next_sentence_label"][r]) for a, r in picked], dtype=torch.long
            )
        return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask", "labels")} | (
            {"next_sentence_label": batch["next_sentence_label"]} if "next_sentence_label" in batch else {}
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "shard_pos": self.shard_pos,
            "row_pos": self.row_pos,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "total": self.index["total"],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = (self.seed, self.rank, self.world_size, self.index["total"])
        theirs = (state["seed"], state["rank"], state["world_size"], state["total"])
        if mine != theirs:
            raise BertforgeError(
                f"cannot resume: static reader state is for (seed, rank, world_size, total)={theirs}, not {mine}"
            )
        self.epoch, self.shard_pos, self.row_pos = int(state["epoch"]), int(state["shard_pos"]), int(state["row_pos"])
