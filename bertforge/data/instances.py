"""From a document stream to training instances: BERT's sentence pairs (NSP), ALBERT's sentence-order pairs (SOP)
or RoBERTa's packed sequences. ``InstanceStream(..., sentence_objective="nsp" | "sop" | None)`` picks one (None:
packing, MLM only); the older ``nsp=True/False`` switch still works (see :func:`resolve_sentence_objective`).

NSP mode follows the BERT paper's data recipe (google-research/bert ``create_pretraining_data.py``):

* per document, the target length is ``max_seq_length - 3``; with probability ``short_seq_prob`` it is a random
  length in ``[2, max_seq_length - 3]`` instead (drawn once per document);
* whole sentences are accumulated into a chunk until it reaches the target (or the document ends); the chunk is
  split at a random sentence boundary into segment A;
* B is the rest of the chunk (IsNext, label 0) half of the time; otherwise, and always when the chunk is a single
  sentence, B is a span of sentences from a random *other* document, starting at a random sentence, long enough
  for the target (NotNext, label 1), and the chunk's unused sentences go back to be read again;
* the pair is trimmed to fit by removing one token at a time from the longer segment, at its front or back at
  random; the instance is ``[CLS] A [SEP] B [SEP]`` with token types 0 for ``[CLS] A [SEP]`` and 1 for ``B [SEP]``.

Streaming replaces BERT's "all documents in memory": the random other document is drawn from a window of the next
``doc_buffer`` documents of the stream (default 1000, also bounded by ``doc_buffer_tokens``) - never the current
document itself, nor another copy of it from a later epoch. Instances never mix documents except for a NotNext B.

SOP mode follows ALBERT (google-research/albert ``create_pretraining_data.py``, without its random-document
fallback): the same target length, chunks, random A/B sentence boundary and truncation as NSP, but B is always the
rest of the chunk, so both segments are consecutive text of one document; with probability exactly 1/2 (one
``rng.random() < 0.5`` per instance, from the same per-document RNG as NSP) they are swapped, ``[CLS] B [SEP] A
[SEP]``, label 1 (``SWAPPED``), else label 0 (``IN_ORDER``). The label goes where the NSP label goes
(``next_sentence_label``), so the pretraining head's sentence classifier learns it unchanged. The swap comes before
truncation (as in ALBERT), so that "the second segment loses the token on a tie" tells nothing about the order. A
chunk of a single sentence (a one-sentence document, a document's last sentence on its own, a sentence longer
than the target) cannot be split at a sentence boundary: it is cut at a random token boundary instead, so one-line
documents still train SOP; a chunk of a single token makes no instance (and an epoch that makes none at all is an
error). No other document is ever used and there is no document window.

No-NSP mode (RoBERTa FULL-SENTENCES): the sentences are laid end to end in one token stream, with one extra
``[SEP]`` between documents, and cut into sequences of exactly ``max_seq_length`` (``[CLS]`` + content + ``[SEP]``),
so sequences cross document boundaries; a sentence that does not fit continues in the next sequence; token types
are all 0 and the NSP label is -100.

Instances then pass through a shuffle buffer of ``shuffle_buffer`` instances (random pick, refill), or of one
epoch's worth when an epoch of the corpus makes fewer: filling the buffer never reads the corpus again (a small
corpus whose epoch makes 30 instances was once re-read and re-tokenized 330 times to fill 10,000 places before the
first batch; a document holding a 1 MB line made that minutes).

Randomness: each document's instances come from ``random.Random`` seeded by (seed, rank, epoch, document number),
the shuffle buffer from one seeded by (seed, rank, epoch) (reseeded when the stream enters a new epoch); the global
RNG is never used. State (see :meth:`InstanceStream.state_dict`) is the reader position of the oldest document in
the window (the window is re-read on resume, it is not stored), the pending and buffered instances (token ids,
base64 int32) and the shuffle RNG state, so that a restored stream goes on with exactly the same instances.
"""

from __future__ import annotations

import base64
import hashlib
import random
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bertforge.constants import IGNORE_INDEX
from bertforge.data.corpus import CorpusReader, Document
from bertforge.errors import BertforgeError

Tokenize = Callable[[list[str]], Sequence[Sequence[int]]]

IS_NEXT = 0
NOT_NEXT = 1
IN_ORDER = 0  # SOP: the two segments in the document's order (transformers' sentence_order_label 0)
SWAPPED = 1  # SOP: the two segments swapped
NO_LABEL = IGNORE_INDEX  # the NSP label of an instance without a pair: its old name, kept importable

SENTENCE_OBJECTIVES = ("nsp", "sop")  # or None: MLM only, RoBERTa FULL-SENTENCES packing


def resolve_sentence_objective(nsp: bool | None, sentence_objective: str | None) -> str | None:
    """The sentence objective from the two ways of asking for it: ``sentence_objective`` ("nsp", "sop" or None for
    MLM only) and the older ``nsp`` switch (None: not given). ``nsp=True`` is "nsp" and contradicts any other
    objective; ``nsp=False`` turns off the default "nsp" (giving None) and leaves "sop" or None as they are."""
    if sentence_objective is not None and sentence_objective not in SENTENCE_OBJECTIVES:
        raise BertforgeError(
            f"unknown sentence_objective {sentence_objective!r}; choose one of {', '.join(SENTENCE_OBJECTIVES)} "
            "or None (MLM only)"
        )
    if nsp is None:
        return sentence_objective
    if nsp:
        if sentence_objective != "nsp":
            raise BertforgeError(f"nsp=True contradicts sentence_objective={sentence_objective!r}")
        return "nsp"
    return None if sentence_objective == "nsp" else sentence_objective


def derive_seed(*parts: Any) -> int:
    """A 63-bit seed from any tuple of ints/strings, stable across runs, platforms and Python versions."""
    digest = hashlib.blake2b(repr(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(slots=True)
class Instance:
    """One training sequence, special tokens included, not yet masked or padded."""

    input_ids: list[int]
    num_a: int  # tokens of type 0 (``[CLS] A [SEP]``); equal to len(input_ids) when there is no segment B
    next_sentence_label: int = IGNORE_INDEX  # 0 IsNext, 1 NotNext, -100 none

    @property
    def token_type_ids(self) -> list[int]:
        return [0] * self.num_a + [1] * (len(self.input_ids) - self.num_a)


# ---------------------------------------------------------------------------------------------- NSP pairs
def truncate_pair(tokens_a: list[int], tokens_b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim in place until len(a) + len(b) <= max_tokens: one token at a time from the longer segment (B on a
    tie), from its front or its back at random (front if ``rng.random() < 0.5``).

    Linear time: each removal's draw and decision depend only on the two current lengths, so the removals are
    simulated on the lengths and only counted (front/back, per segment), then applied with one slice deletion
    each. The draws, the decisions and the result are exactly those of removing one token at a time.
    """
    if max_tokens < 0:
        # Both segments are emptied, then the next removal fails (IndexError), as one token at a time would.
        truncate_pair(tokens_a, tokens_b, 0, rng)
        if rng.random() < 0.5:
            del tokens_b[0]
        else:
            tokens_b.pop()
        return
    len_a, len_b = len(tokens_a), len(tokens_b)
    excess = len_a + len_b - max_tokens  # removals still to make
    if excess <= 0:
        return
    draw = rng.random
    front_a = back_a = front_b = back_b = 0
    # Phase 1: the longer segment alone, until the lengths are equal (or nothing is left to remove).
    if len_a != len_b:
        k = min(abs(len_a - len_b), excess)
        fronts = sum([draw() < 0.5 for _ in range(k)])
        if len_a > len_b:
            front_a, back_a, len_a = fronts, k - fronts, len_a - k
        else:
            front_b, back_b, len_b = fronts, k - fronts, len_b - k
        excess -= k
    # Phase 2 (equal lengths): B (a tie), then A (now longer by one), then B (a tie again), ... alternately.
    if excess > 0:
        fronts = [draw() < 0.5 for _ in range(excess)]
        on_b, on_a = fronts[0::2], fronts[1::2]
        f = sum(on_b)
        front_b += f
        back_b += len(on_b) - f
        f = sum(on_a)
        front_a += f
        back_a += len(on_a) - f
    for tokens, front, back in ((tokens_a, front_a, back_a), (tokens_b, front_b, back_b)):
        if back:
            del tokens[len(tokens) - back :]
        if front:
            del tokens[:front]


def _join(sentences: Sequence[Sequence[int]]) -> list[int]:
    return [t for sentence in sentences for t in sentence]


# (first segment, second segment, label, sentences of the chunk to read again)
Pair = tuple[list[int], list[int], int, int]
# make_pair(chunk, rng, target) -> a Pair, or None when the chunk gives no pair
PairMaker = Callable[[list[Sequence[int]], random.Random, int], "Pair | None"]


class PairLayout(NamedTuple):
    """How NSP and SOP lay a pair out: ``[CLS] A [SEP] B [SEP]`` in at most ``max_seq_length`` ids, aiming at a
    shorter random length with probability ``short_seq_prob`` (drawn once per document)."""

    max_seq_length: int
    short_seq_prob: float
    cls_id: int
    sep_id: int


def _create_pair_instances(
    document: Sequence[Sequence[int]], make_pair: PairMaker, rng: random.Random, layout: PairLayout
) -> list[Instance]:
    """BERT's A/B loop, shared by NSP and SOP: the document's target length (``short_seq_prob``), whole sentences
    accumulated into a chunk until it reaches the target or the document ends, ``make_pair`` turning each chunk into
    two segments and a label, the pair trimmed by :func:`truncate_pair` and laid out as ``[CLS] A [SEP] B [SEP]``."""
    max_tokens = layout.max_seq_length - 3
    target = max_tokens
    if rng.random() < layout.short_seq_prob:
        target = rng.randint(2, max_tokens)

    instances: list[Instance] = []
    chunk: list[Sequence[int]] = []
    chunk_len = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_len += len(document[i])
        if i == len(document) - 1 or chunk_len >= target:
            pair = make_pair(chunk, rng, target)
            if pair is not None:
                tokens_a, tokens_b, label, read_again = pair
                i -= read_again
                truncate_pair(tokens_a, tokens_b, max_tokens, rng)
                ids = [layout.cls_id, *tokens_a, layout.sep_id, *tokens_b, layout.sep_id]
                instances.append(Instance(ids, len(tokens_a) + 2, label))
            chunk = []
            chunk_len = 0
        i += 1
    return instances


def create_nsp_instances(
    document: Sequence[Sequence[int]],
    random_document: Callable[[random.Random], Sequence[Sequence[int]] | None],
    rng: random.Random,
    layout: PairLayout,
) -> list[Instance]:
    """All sentence-pair instances of one tokenized document (a list of sentences, each a list of ids).

    ``random_document(rng)`` returns the sentences of some other document (never this one), or None if there is
    none, which is an error as soon as one is needed.
    """

    def nsp_pair(chunk: list[Sequence[int]], rng: random.Random, target: int) -> Pair:
        a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
        tokens_a = _join(chunk[:a_end])
        if len(chunk) >= 2 and rng.random() >= 0.5:
            return tokens_a, _join(chunk[a_end:]), IS_NEXT, 0
        target_b = target - len(tokens_a)
        other = random_document(rng)
        if not other:
            raise BertforgeError(
                "next-sentence prediction needs at least two documents that produce tokens, found one "
                "(separate documents with a blank line, or turn NSP off)"
            )
        start = rng.randint(0, len(other) - 1)
        tokens_b: list[int] = []
        for j in range(start, len(other)):  # not other[start:]: a copy of a long document's sentences each time
            tokens_b.extend(other[j])
            if len(tokens_b) >= target_b:
                break
        return tokens_a, tokens_b, NOT_NEXT, len(chunk) - a_end  # the chunk's unused sentences are read again

    return _create_pair_instances(document, nsp_pair, rng, layout)


def _sop_pair(chunk: list[Sequence[int]], rng: random.Random, target: int) -> Pair | None:
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        first, second = _join(chunk[:a_end]), _join(chunk[a_end:])
    elif len(chunk[0]) >= 2:  # one sentence: cut it at a random token boundary
        cut = rng.randint(1, len(chunk[0]) - 1)
        first, second = list(chunk[0][:cut]), list(chunk[0][cut:])
    else:
        return None  # a one-token chunk gives no pair
    if rng.random() < 0.5:
        return second, first, SWAPPED, 0
    return first, second, IN_ORDER, 0


def create_sop_instances(document: Sequence[Sequence[int]], rng: random.Random, layout: PairLayout) -> list[Instance]:
    """All sentence-order instances of one tokenized document (ALBERT's SOP): BERT's chunks and A/B split (as
    :func:`create_nsp_instances`), B always the rest of the chunk; with probability 1/2 the two are swapped
    (``[CLS] B [SEP] A [SEP]``, label :data:`SWAPPED`), else kept (label :data:`IN_ORDER`). The swap is decided
    before :func:`truncate_pair` trims the pair, as ALBERT does, so the trimming rule (the second segment loses a
    token on a tie) says nothing about the order. No other document is ever used: a chunk of one sentence is cut
    at a random token boundary instead, and a chunk of a single token (a one-token document or last sentence)
    makes no instance."""
    return _create_pair_instances(document, _sop_pair, rng, layout)


# ---------------------------------------------------------------------------------------------- packing
class SequencePacker:
    """RoBERTa FULL-SENTENCES packing into sequences of exactly ``max_seq_length`` tokens."""

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int) -> None:
        self.capacity = max_seq_length - 2
        self.cls_id = cls_id
        self.sep_id = sep_id
        self.current: list[int] = []  # content of the sequence being filled (< capacity tokens)
        self.seen_document = False

    def add_document(self, sentences: Sequence[Sequence[int]]) -> list[Instance]:
        out: list[Instance] = []
        if self.seen_document and self.current:
            self.current.append(self.sep_id)  # document separator (skipped at a sequence start)
        self.seen_document = True
        current, capacity = self.current, self.capacity
        for sentence in sentences:
            current.extend(sentence)
            # Walk an offset through the tokens and drop the cut sequences once (linear in the sentence length).
            start = 0
            while len(current) - start >= capacity:
                ids = [self.cls_id]
                ids += current[start : start + capacity]
                ids.append(self.sep_id)
                start += capacity
                out.append(Instance(ids, len(ids), IGNORE_INDEX))
            if start:
                del current[:start]
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"current": list(self.current), "seen_document": self.seen_document}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = [int(t) for t in state["current"]]
        self.seen_document = bool(state["seen_document"])


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
        nsp: bool | None = None,
        sentence_objective: str | None = "nsp",
        short_seq_prob: float = 0.1,
        seed: int = 0,
        rank: int = 0,
        shuffle_buffer: int = 10000,
        doc_buffer: int = 1000,
        doc_buffer_tokens: int = 4_000_000,
        max_epochs: int | None = None,
    ) -> None:
        objective = resolve_sentence_objective(nsp, sentence_objective)
        nsp = objective == "nsp"
        min_len = 3 if objective is None else 5
        if max_seq_length < min_len:
            raise BertforgeError(f"max_seq_length must be at least {min_len} (got {max_seq_length})")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise BertforgeError(f"short_seq_prob must be within [0, 1] (got {short_seq_prob})")
        if shuffle_buffer < 0:
            raise BertforgeError(f"shuffle_buffer must be >= 0 (got {shuffle_buffer})")
        if nsp and doc_buffer < 2:
            raise BertforgeError(f"doc_buffer must be at least 2 documents with NSP (got {doc_buffer})")
        self.reader = reader
        self.tokenize = tokenize
        self.pair_layout = PairLayout(max_seq_length, short_seq_prob, cls_id, sep_id)
        self.sentence_objective = objective
        self.nsp = nsp
        self.seed, self.rank = seed, rank
        self.shuffle_capacity = max(1, shuffle_buffer)
        self.doc_buffer = doc_buffer
        self.doc_buffer_tokens = doc_buffer_tokens
        self.max_epochs = max_epochs
        reader.min_docs = max(reader.min_docs, 2 if nsp else 1)

        self.window: deque[_WindowDoc] = deque()
        self.window_tokens = 0
        self.packer = SequencePacker(max_seq_length, cls_id, sep_id)
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
        if n >= self.doc_buffer or self.window_tokens >= self.doc_buffer_tokens:
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
        """``shuffle_buffer``, or fewer: what one epoch of the corpus makes, once an epoch has been read, so that
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
