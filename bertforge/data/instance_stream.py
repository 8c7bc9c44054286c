"""The stream of training instances: documents from a :class:`CorpusReader`, tokenized, turned into NSP pairs, SOP
pairs or packed sequences by the recipes of :mod:`bertforge.data.instances`, shuffled, and resumable.

Streaming replaces BERT's "all documents in memory": the random other document is drawn from a window of the next
documents of the stream - never the current document itself, nor another copy of it from a later epoch. Instances
never mix documents except for a NotNext B. Instances then pass through a shuffle buffer (random pick, refill).
:class:`Buffers` says how large the window and the shuffle buffer are.

Randomness: each document's instances come from ``random.Random`` seeded by (seed, rank, epoch, document number),
the shuffle buffer from one seeded by (seed, rank, epoch) (reseeded when the stream enters a new epoch); the global
RNG is never used. State (see :meth:`InstanceStream.state_dict`) is the reader position of the oldest document in
the window (the window is re-read on resume, it is not stored), the pending and buffered instances (token ids,
base64 int32) and the shuffle RNG state, so that a restored stream goes on with exactly the same instances.
"""

from __future__ import annotations

import base64
import random
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertforge.data.corpus import CorpusReader, Document
from bertforge.data.instances import (
    DocumentPacker,
    Instance,
    PairLayout,
    SequencePacker,
    create_nsp_instances,
    create_sop_instances,
    SENTENCE_OBJECTIVES,
    derive_seed,
)
from bertforge.core.errors import BertforgeError

Tokenize = Callable[[list[str]], Sequence[Sequence[int]]]
#: how MLM-only rows are filled: "stream" (RoBERTa's FULL-SENTENCES, `SequencePacker`) or "documents" (ModernBERT's,
#: `DocumentPacker`: each document its own [CLS] … [SEP], attended within itself)
PACKINGS = ("stream", "documents")


# ---------------------------------------------------------------------------------------------- (de)serialising
def encode_instances(instances: Sequence[Instance]) -> dict[str, Any]:
    ids = np.fromiter((t for inst in instances for t in inst.input_ids), dtype="<i4")
    return {
        "ids": base64.b64encode(ids.tobytes()).decode("ascii"),
        "lengths": [len(inst.input_ids) for inst in instances],
        "num_a": [inst.num_a for inst in instances],
        "labels": [inst.next_sentence_label for inst in instances],
    }


def decode_instances(data: dict[str, Any]) -> list[Instance]:
    ids = np.frombuffer(base64.b64decode(data["ids"]), dtype="<i4").tolist()
    out, pos = [], 0
    for length, num_a, label in zip(data["lengths"], data["num_a"], data["labels"], strict=True):
        out.append(Instance(ids[pos : pos + length], int(num_a), int(label)))
        pos += length
    if pos != len(ids):
        raise BertforgeError("cannot resume: the checkpoint's instance buffer is corrupt (token count mismatch)")
    return out


def rng_state_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_state_from_json(state: list[Any]) -> tuple[Any, ...]:
    return (state[0], tuple(state[1]), state[2])


@dataclass(frozen=True, slots=True)
class Buffers:
    """What the instance stream holds in memory.

    ``shuffle``: the shuffle buffer, in instances (0 or 1: no shuffling), or one epoch's worth when an epoch of the
    corpus makes fewer, so that filling it never reads the corpus again (a small corpus whose epoch makes 30
    instances was once re-read and re-tokenized 330 times to fill 10,000 places before the first batch; a document
    holding a 1 MB line made that minutes).
    ``documents``: the NSP window the random other document is drawn from, in documents (at least 2 with NSP).
    ``document_tokens``: the same window, in tokens (whichever bound is reached first).
    """

    shuffle: int = 10000
    documents: int = 1000
    document_tokens: int = 4_000_000


@dataclass(slots=True)
class _WindowDoc:
    index: int
    epoch: int
    sentences: list[array]
    n_tokens: int
    before: dict[str, Any]  # reader position before this document was read


# ---------------------------------------------------------------------------------------------- stream
class InstanceStream:
    """Endless (or ``max_epochs``-long) stream of shuffled :class:`Instance` s from a :class:`CorpusReader`."""

    def __init__(
        self,
        reader: CorpusReader,
        tokenize: Tokenize,
        *,
        cls_id: int,
        sep_id: int,
        max_seq_length: int = 128,
        sentence_objective: str | None = "nsp",
        short_seq_prob: float = 0.1,
        seed: int = 0,
        rank: int = 0,
        buffers: Buffers = Buffers(),
        max_epochs: int | None = None,
        packing: str = "stream",
    ) -> None:
        objective = sentence_objective
        if objective is not None and objective not in SENTENCE_OBJECTIVES:
            raise BertforgeError(f"unknown sentence_objective {objective!r}; choose one of "
                                 f"{', '.join(SENTENCE_OBJECTIVES)} or None (MLM only)")
        if packing not in PACKINGS or (packing == "documents" and objective is not None):
            raise BertforgeError(f"packing {packing!r}: choose {' or '.join(PACKINGS)}; documents only without a "
                                 f"sentence objective (not {objective!r})")
        nsp = objective == "nsp"
        min_len = 3 if objective is None else 5
        if max_seq_length < min_len:
            raise BertforgeError(f"max_seq_length must be at least {min_len} (got {max_seq_length})")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise BertforgeError(f"short_seq_prob must be within [0, 1] (got {short_seq_prob})")
        if buffers.shuffle < 0:
            raise BertforgeError(f"buffers.shuffle must be >= 0 instances (got {buffers.shuffle})")
        if nsp and buffers.documents < 2:
            raise BertforgeError(f"buffers.documents must be at least 2 with NSP (got {buffers.documents})")
        self.reader = reader
        self.tokenize = tokenize
        self.pair_layout = PairLayout(max_seq_length, short_seq_prob, cls_id, sep_id)
        self.sentence_objective = objective
        self.nsp = nsp
        self.seed, self.rank = seed, rank
        self.buffers = buffers
        self.shuffle_capacity = max(1, buffers.shuffle)
        self.max_epochs = max_epochs
        reader.min_docs = max(reader.min_docs, 2 if nsp else 1)

        self.window: deque[_WindowDoc] = deque()
        self.window_tokens = 0
        self.packing = packing
        self.packer: SequencePacker | DocumentPacker = (DocumentPacker if packing == "documents" else SequencePacker)(
            max_seq_length, cls_id, sep_id)
        self.pending: deque[Instance] = deque()
        self.buffer: list[Instance] = []
        self.shuffle_epoch = 0
        self.rng = random.Random(derive_seed(seed, rank, 0, "shuffle"))
        self.exhausted = False
        self.epoch = 0  # epoch of the last document turned into instances
        self.instances_made = 0
        self.docs_processed = 0
        self.epoch_instances = 0  # instances made from the documents of `epoch` so far
        self.epoch_yield: int | None = None  # instances the last complete epoch made (None before one completes)
        self.docs_without_tokens = 0  # no-NSP: documents read in a row that produced no token

    # ------------------------------------------------------------------ documents
    def _tokenize(self, doc: Document) -> list[array]:
        encoded = self.tokenize(doc.sentences)
        if len(encoded) != len(doc.sentences):
            raise BertforgeError(
                f"tokenize returned {len(encoded)} sequences for {len(doc.sentences)} sentences ({doc.source})"
            )
        # array('i'): 4 bytes a token in the document window instead of a Python int object each
        return [array("i", ids) for ids in encoded if len(ids)]

    def _read_into_window(self) -> None:
        before = self.reader.position()
        doc = self.reader.next_document()
        if doc is None:
            raise BertforgeError("the corpus reader ended; the instance stream needs a cycling reader")
        sentences = self._tokenize(doc)
        if sentences:
            n = sum(map(len, sentences))
            self.window.append(_WindowDoc(doc.index, doc.epoch, sentences, n, before))
            self.window_tokens += n

    def _window_full(self) -> bool:
        n = len(self.window)
        if n < 2:
            return False
        if n >= self.buffers.documents or self.window_tokens >= self.buffers.document_tokens:
            return True
        per_epoch = self.reader.docs_per_epoch
        return per_epoch is not None and n >= per_epoch  # small corpus: never hold a document twice

    def _fill_window(self) -> None:
        reads_without_tokens = 0
        while not self._window_full():
            size = len(self.window)
            self._read_into_window()
            if len(self.window) == size:
                reads_without_tokens += 1
                per_epoch = self.reader.docs_per_epoch
                if per_epoch is not None and reads_without_tokens > per_epoch:
                    if size == 0:
                        raise BertforgeError("no document of the corpus produces any token with this tokenizer")
                    break  # a single productive document; create_nsp_instances reports it
            else:
                reads_without_tokens = 0

    def _random_other(self, current: _WindowDoc) -> Callable[[random.Random], list[array] | None]:
        def pick(rng: random.Random) -> list[array] | None:
            n = len(self.window)
            for _ in range(10):
                if n == 0:
                    break
                candidate = self.window[rng.randrange(n)]
                if candidate.index != current.index:
                    return candidate.sentences
            others = [d for d in self.window if d.index != current.index]
            return others[rng.randrange(len(others))].sentences if others else None

        return pick

    def _enter_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:  # the previous epoch is complete: its instance count caps the shuffle buffer
            if self.sentence_objective == "sop" and self.epoch_instances == 0:
                # SOP skips one-token chunks: without this a corpus of them would be read forever
                raise BertforgeError(
                    "no document of the corpus gives a sentence-order pair (a pair needs a document of at least "
                    "two tokens)"
                )
            self.epoch_yield, self.epoch_instances = self.epoch_instances, 0
        if epoch != self.shuffle_epoch:
            self.shuffle_epoch = epoch
            self.rng = random.Random(derive_seed(self.seed, self.rank, epoch, "shuffle"))
        self.epoch = epoch

    def _nsp_instances(self) -> list[Instance] | None:
        """The next document's NSP pairs (NotNext B from another document of the window)."""
        self._fill_window()
        current = self.window[0]
        if self.max_epochs is not None and current.epoch >= self.max_epochs:
            return None
        self.window.popleft()
        self.window_tokens -= current.n_tokens
        self._enter_epoch(current.epoch)
        return create_nsp_instances(
            current.sentences,
            self._random_other(current),
            self._document_rng(current.epoch, current.index),
            self.pair_layout,
        )

    def _document_instances(self) -> list[Instance] | None:
        """The next document's SOP pairs, or (no sentence objective) the sequences it completes in the packer."""
        doc = self.reader.next_document()
        if doc is None:
            raise BertforgeError("the corpus reader ended; the instance stream needs a cycling reader")
        if self.max_epochs is not None and doc.epoch >= self.max_epochs:
            return None
        self._enter_epoch(doc.epoch)
        sentences = self._tokenize(doc)
        if sentences:
            self.docs_without_tokens = 0
        else:
            # Without this guard a corpus in which no document yields a token is read epoch after epoch forever.
            self.docs_without_tokens += 1
            per_epoch = self.reader.docs_per_epoch
            if per_epoch is not None and self.docs_without_tokens > per_epoch:
                raise BertforgeError("no document of the corpus produces any token with this tokenizer")
        if self.sentence_objective == "sop":
            return create_sop_instances(sentences, self._document_rng(doc.epoch, doc.index), self.pair_layout)
        return self.packer.add_document(sentences)

    def _document_rng(self, epoch: int, index: int) -> random.Random:
        return random.Random(derive_seed(self.seed, self.rank, epoch, index, "instances"))

    def _produce(self) -> bool:
        """Turn the next document into pending instances; False when ``max_epochs`` is reached."""
        made = self._nsp_instances() if self.nsp else self._document_instances()
        if made is None:
            return False
        self.pending.extend(made)
        self.instances_made += len(made)
        self.epoch_instances += len(made)
        self.docs_processed += 1
        return True

    # ------------------------------------------------------------------ iteration
    def __iter__(self) -> Iterator[Instance]:
        return self

    @property
    def buffer_capacity(self) -> int:
        """``buffers.shuffle``, or fewer: what one epoch of the corpus makes, once an epoch has been read, so that
        filling the buffer never re-reads (and re-tokenizes) a small corpus over and over."""
        if self.epoch_yield is None:
            return self.shuffle_capacity
        return max(1, min(self.shuffle_capacity, self.epoch_yield))

    def __next__(self) -> Instance:
        while len(self.buffer) < self.buffer_capacity and not self.exhausted:
            if self.pending:
                self.buffer.append(self.pending.popleft())
            elif not self._produce():
                self.exhausted = True
        if not self.buffer:
            raise StopIteration
        j = self.rng.randrange(len(self.buffer))
        item = self.buffer[j]
        self.buffer[j] = self.buffer[-1]
        self.buffer.pop()
        return item

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "reader": self.reader.state_dict(),
            "window_start": self.window[0].before if self.window else None,
            "pending": encode_instances(list(self.pending)),
            "buffer": encode_instances(self.buffer),
            "rng": rng_state_to_json(self.rng),
            "shuffle_epoch": self.shuffle_epoch,
            "epoch": self.epoch,
            "packer": self.packer.state_dict(),
            "exhausted": self.exhausted,
            "instances_made": self.instances_made,
            "docs_processed": self.docs_processed,
            "epoch_instances": self.epoch_instances,
            "epoch_yield": self.epoch_yield,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        reader_state = state["reader"]
        self.reader.load_state_dict(reader_state)  # validates files/sharding, sets docs_per_epoch and stats
        self.window.clear()
        self.window_tokens = 0
        if state["window_start"] is not None:
            # Re-read (and re-tokenize) the window's documents instead of storing them.
            target = self.reader.position()
            stats = self.reader.stats_dict()
            self.reader.seek(state["window_start"])
            key = ("epoch", "file_idx", "offset")
            goal = tuple(target[k] for k in key)
            while tuple(self.reader.position()[k] for k in key) < goal:
                self._read_into_window()
            if self.reader.position() != target:
                raise BertforgeError("cannot resume: the corpus files changed since the checkpoint was written")
            self.reader.load_stats(stats)
        self.pending = deque(decode_instances(state["pending"]))
        self.buffer = decode_instances(state["buffer"])
        self.rng = random.Random()
        self.rng.setstate(rng_state_from_json(state["rng"]))
        self.shuffle_epoch = int(state["shuffle_epoch"])
        self.epoch = int(state["epoch"])
        self.packer.load_state_dict(state["packer"])
        self.exhausted = bool(state["exhausted"])
        self.instances_made = int(state["instances_made"])
        self.docs_processed = int(state["docs_processed"])
        # absent in the states of older versions: the buffer is capped from the next epoch on
        self.epoch_instances = int(state.get("epoch_instances", 0))
        yielded = state.get("epoch_yield")
        self.epoch_yield = None if yielded is None else int(yielded)
