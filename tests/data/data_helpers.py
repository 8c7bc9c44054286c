"""Tiny generated corpora and a word-level tokenizer whose ids say exactly where each token came from."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

from tests.helpers import SPECIALS

from bertforge.data import PretrainingStream
from bertforge.data.instances import Instance
from bertforge.data.masking import MaskingCollator

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
N_SPECIAL = 5
VOCAB = 1000  # the vocabulary size of the masking tests' collators
SPECIAL = {PAD, CLS, SEP, MASK}


def tagged_docs(n_docs: int, *, seed: int = 0, sentences=(1, 8), words=(3, 12), doc_offset: int = 0) -> list[list[str]]:
    """Documents whose every word is unique: ``d{doc}s{sentence}w{word}``."""
    rng = random.Random(seed)
    docs = []
    for d in range(doc_offset, doc_offset + n_docs):
        docs.append(
            [" ".join(f"d{d}s{s}w{w}" for w in range(rng.randint(*words))) for s in range(rng.randint(*sentences))]
        )
    return docs


def docs_text(docs: list[list[str]]) -> str:
    return "\n\n".join("\n".join(doc) for doc in docs) + "\n"


def write_txt(path: Path, docs: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(docs_text(docs), encoding="utf-8")
    return path


def write_gz(path: Path, docs: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(docs_text(docs))
    return path


def write_jsonl(path: Path, docs: list[list[str]], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps({"id": len(doc), field: "\n".join(doc)}) + "\n")
    return path


class WordVocab:
    """Whitespace tokenizer over a fixed word list; id -> word -> (doc, sentence, word) for tagged words."""

    def __init__(self, docs: list[list[str]], extra_words: tuple[str, ...] = ()) -> None:
        self.words = list(SPECIALS)
        seen = set(self.words)
        for word in [w for doc in docs for sent in doc for w in sent.split()] + list(extra_words):
            if word not in seen:
                seen.add(word)
                self.words.append(word)
        self.ids = {w: i for i, w in enumerate(self.words)}

    @property
    def size(self) -> int:
        return len(self.words)

    def tokenize(self, sentences: list[str]) -> list[list[int]]:
        return [[self.ids.get(w, UNK) for w in s.split()] for s in sentences]

    def tag(self, token_id: int) -> tuple[int, int, int]:
        word = self.words[token_id]
        d, rest = word[1:].split("s")
        s, w = rest.split("w")
        return int(d), int(s), int(w)

    def special_kwargs(self) -> dict[str, int]:
        return {"cls_id": CLS, "sep_id": SEP, "pad_id": PAD, "mask_id": MASK, "vocab_size": self.size}


def make_stream(path, vocab, **kw):
    return PretrainingStream(path, vocab.tokenize, **vocab.special_kwargs(), **kw)


def at_least_half(count: int, n: int) -> bool:
    """`count` of `n` instances is no lower than 4 sigma under n/2, for an outcome each instance has with
    probability 1/2 or more: sigma = sqrt(n * 1/2 * 1/2)."""
    return count >= n / 2 - 4 * math.sqrt(n * 0.25)


def take(stream, n):
    out = []
    while len(out) < n:
        out.extend(stream.next_instances())
    return out[:n]


def split_pair(inst):
    ids = inst.input_ids
    return ids[1 : inst.num_a - 1], ids[inst.num_a : -1]


def collator(**kw):
    """A `MaskingCollator` over a vocabulary of `VOCAB` ids with this file's special ids."""
    return MaskingCollator(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, vocab_size=VOCAB, **kw)


def random_instances(rng, n, lo=6, hi=60):
    """`n` sentence pairs of random non-special ids, segment A `lo`..`hi` tokens long."""
    out = []
    for _ in range(n):
        a = [rng.randrange(5, VOCAB) for _ in range(rng.randint(lo, hi))]
        b = [rng.randrange(5, VOCAB) for _ in range(rng.randint(1, 10))]
        out.append(Instance([CLS, *a, SEP, *b, SEP], len(a) + 2, rng.randint(0, 1)))
    return out
