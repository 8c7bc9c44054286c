"""From a document's sentences to training instances: BERT's sentence pairs (NSP), ALBERT's sentence-order pairs
(SOP) or RoBERTa's packed sequences. The stream (``instance_stream.InstanceStream(..., sentence_objective="nsp" |
"sop" | None)``) picks one (None: packing, MLM only).

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

The random other document comes from the stream's window of documents (:mod:`bertforge.data.instance_stream`).

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

Document packing (ModernBERT, ``packing="documents"``, :class:`DocumentPacker`): each document is its own
``[CLS] … [SEP]``, laid end to end in rows of at most ``max_seq_length``; a document longer than what the row has left
is cut there and goes on, as another ``[CLS] … [SEP]`` piece, in the next row. Every ``[CLS]`` starts a piece, so
the collator reads the pieces' boundaries off the ids and the model attends within each piece only.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from bertforge.core.constants import IGNORE_INDEX
from bertforge.core.errors import BertforgeError

IS_NEXT = 0
NOT_NEXT = 1
IN_ORDER = 0  # SOP: the two segments in the document's order (transformers' sentence_order_label 0)
SWAPPED = 1  # SOP: the two segments swapped

SENTENCE_OBJECTIVES = ("nsp", "sop")  # or None: MLM only, RoBERTa FULL-SENTENCES packing


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
        flips = [draw() < 0.5 for _ in range(excess)]
        on_b, on_a = flips[0::2], flips[1::2]
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


class DocumentPacker:
    """ModernBERT's packing: each document ``[CLS] … [SEP]``, end to end, in rows of at most ``max_seq_length``
    tokens. A document that does not fit in what the row has left is cut there (when at least ``min_piece`` content
    tokens fit, else the row is closed as it is) and goes on as a new ``[CLS] … [SEP]`` piece in the next row; a
    row is emitted once it is full. Rows are as long as they can be; only a row closed early is shorter."""

    def __init__(self, max_seq_length: int, cls_id: int, sep_id: int, min_piece: int = 16) -> None:
        self.max_seq_length = max_seq_length
        self.cls_id, self.sep_id = cls_id, sep_id
        self.min_piece = min_piece
        self.current: list[int] = []  # the row being filled: whole pieces, [CLS] … [SEP] each

    def add_document(self, sentences: Sequence[Sequence[int]]) -> list[Instance]:
        tokens = _join(sentences)
        out: list[Instance] = []
        start = 0
        while start < len(tokens):
            room = self.max_seq_length - len(self.current) - 2  # content tokens the row still takes
            rest = len(tokens) - start
            if room < 1 or (room < rest and room < self.min_piece and self.current):
                out.append(self._close())  # too little room for a useful piece: the document starts a new row
                continue
            piece = tokens[start : start + room]
            self.current += [self.cls_id, *piece, self.sep_id]
            start += len(piece)
        if len(self.current) > self.max_seq_length - 3:  # no room for another piece with content
            out.append(self._close())
        return out

    def _close(self) -> Instance:
        ids, self.current = self.current, []
        return Instance(ids, len(ids), IGNORE_INDEX)

    def state_dict(self) -> dict[str, Any]:
        return {"current": list(self.current)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.current = [int(t) for t in state["current"]]
