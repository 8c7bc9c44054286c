"""Tiny generated data and a tiny BERT (hand-written WordPiece vocabulary, 2 layers of width 32) for the
fine-tuning tests. Nothing here reads /work/shared."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest

from bertforge import BertModel
from tests.helpers import SPECIALS, tiny_config, write_uncased_tokenizer

WORDS = (
    "the a an is was not very good great fun bad awful boring movie film plot actors this it i loves hates likes "
    "john mary peter lives works visited in at and of paris london berlin acme corp google where who does what city "
    "company am ##ster ##dam ##s"
).split()
PUNCTUATION = list(".,?!'-")


def vocabulary() -> list[str]:
    letters = list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase] + list(string.digits)
    return SPECIALS + PUNCTUATION + WORDS + [t for t in letters if t not in WORDS]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised 2-layer BERT with its tokenizer files (vocab.txt), as a checkpoint directory."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def cross_encoder_dir(tiny_model, tmp_path_factory) -> Path:
    """A transformers BertForSequenceClassification (one logit, large random weights: logits far apart) with the
    tiny model's tokenizer (the reranking tests' reference model)."""
    from tests.evaluation.evaluation_helpers import cross_encoder_dir as make_cross_encoder

    return make_cross_encoder(tmp_path_factory.mktemp("cross_encoder"), tiny_model)


def save_tiny_model(directory: Path) -> Path:
    """`tiny_model` into `directory` (also the fixture of the command tests, `tests/commands/conftest.py`)."""
    import torch

    vocab = vocabulary()
    write_uncased_tokenizer(directory, vocab)
    torch.manual_seed(0)
    BertModel(tiny_config(vocab_size=len(vocab))).save_pretrained(directory)
    return directory


POSITIVE = ["good movie", "a great film", "very good plot", "i loves this film", "great actors", "fun movie"]
NEGATIVE = ["bad movie", "an awful film", "very boring plot", "i hates this film", "awful actors", "not fun"]


def write_sentiment(path: Path, n: int = 24, labels: tuple[str, str] = ("neg", "pos")) -> Path:
    """A TSV (header `sentence\\tlabel`) alternating negative and positive phrases."""
    rows = ["sentence\tlabel"]
    for i in range(n):
        source, label = (POSITIVE, labels[1]) if i % 2 else (NEGATIVE, labels[0])
        rows.append(f"{source[(i // 2) % len(source)]}\t{label}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


NER_SENTENCES = [
    [("john", "B-PER"), ("lives", "O"), ("in", "O"), ("amsterdam", "B-LOC"), (".", "O")],
    [("mary", "B-PER"), ("works", "O"), ("at", "O"), ("acme", "B-ORG"), ("corp", "I-ORG")],
    [("peter", "B-PER"), ("visited", "O"), ("berlin", "B-LOC"), ("and", "O"), ("paris", "B-LOC")],
    [("google", "B-ORG"), ("loves", "O"), ("london", "B-LOC")],
]


def write_conll(path: Path, copies: int = 3, docstart: bool = True) -> Path:
    """CoNLL-2003 layout: word, POS, chunk, NER tag; -DOCSTART- and blank lines between sentences."""
    lines = ["-DOCSTART- -X- -X- O", ""] if docstart else []
    for _ in range(copies):
        for sentence in NER_SENTENCES:
            lines += [f"{word} NN B-NP {tag}" for word, tag in sentence] + [""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


QA_FACTS = [
    ("john lives in paris and works at acme corp .", "where does john live ?", "paris"),
    ("mary visited berlin . peter works at google in london .", "who works at google ?", "peter"),
    ("the film was great . the actors of the film loves london .", "what city does the actors loves ?", "london"),
]


def write_squad(path: Path, version_2: bool = True, copies: int = 2) -> Path:
    """A SQuAD file whose contexts are long enough to need several windows at max_length 32."""
    filler = "the plot of this movie was very good and the actors were great . "
    paragraphs = []
    n = 0
    for copy in range(copies):
        for context, question, answer in QA_FACTS:
            text = filler * (copy + 1) + context + " " + filler
            qas = [{"id": f"q{n}", "question": question,
                    "answers": [{"text": answer, "answer_start": text.index(" " + answer) + 1}],
                    "is_impossible": False}]
            n += 1
            if version_2:
                qas.append({"id": f"q{n}", "question": "who is the company of mary ?", "answers": [],
                            "plausible_answers": [{"text": "acme", "answer_start": 0}], "is_impossible": True})
                n += 1
            paragraphs.append({"context": text, "qas": qas})
    data = {"version": "v2.0" if version_2 else "1.1", "data": [{"title": "tiny", "paragraphs": paragraphs}]}
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------ separable data for learning
# Random sentences in which one word decides the answer, so a tiny model can learn them in a few seconds and a
# dev set drawn with another seed (new sentences) shows whether it did.

FILLER = "the a this it was is very movie film plot actors and of i".split()
POSITIVE_WORDS, NEGATIVE_WORDS = ("good", "great", "fun"), ("bad", "awful", "boring")
PERSONS = ("john", "mary", "peter")
CITIES = ("paris", "london", "berlin", "amsterdam")  # amsterdam is three pieces: am ##ster ##dam
COMPANIES = (("acme", "corp"), ("google",), ("acme",))
NEUTRAL = "the a is was lives works visited in at and of loves hates likes very".split()


def write_separable_sentiment(path: Path, n: int, seed: int) -> Path:
    """`n` rows (TSV, `sentence\\tlabel`, neg and pos alternating): 3-7 filler words and one sentiment word."""
    import random

    rng = random.Random(seed)
    rows = ["sentence\tlabel"]
    for i in range(n):
        positive = i % 2 == 1
        words = [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]
        words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE_WORDS if positive else NEGATIVE_WORDS))
        rows.append(" ".join(words) + "\t" + ("pos" if positive else "neg"))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def write_separable_conll(path: Path, n: int, seed: int) -> Path:
    """`n` CoNLL sentences of 3-8 slots, each a person (B-PER), a city (B-LOC), a one- or two-word company
    (B-ORG I-ORG) or a neutral word (O); the word alone decides its tag."""
    import random

    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n):
        for _ in range(rng.randint(3, 8)):
            roll = rng.random()
            if roll < 0.15:
                words, kind = [rng.choice(PERSONS)], "PER"
            elif roll < 0.3:
                words, kind = [rng.choice(CITIES)], "LOC"
            elif roll < 0.4:
                words, kind = list(rng.choice(COMPANIES)), "ORG"
            else:
                words, kind = [rng.choice(NEUTRAL)], None
            for k, word in enumerate(words):
                tag = "O" if kind is None else ("B-" if k == 0 else "I-") + kind
                lines.append(f"{word} NN B-NP {tag}")
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_separable_squad(path: Path, n: int, seed: int) -> Path:
    """`n` SQuAD v1.1 questions "what city ?" on contexts of 4-10 neutral words, a person and one city (the
    answer)."""
    import random

    rng = random.Random(seed)
    paragraphs = []
    for q in range(n):
        city = rng.choice(CITIES)
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(4, 10))]
        words.insert(rng.randint(0, len(words)), city)
        words.insert(rng.randint(0, len(words)), rng.choice(PERSONS))
        text = " ".join(words)
        start = len(" ".join(words[: words.index(city)])) + (1 if words.index(city) else 0)
        assert text[start : start + len(city)] == city
        paragraphs.append({"context": text, "qas": [{"id": f"q{q}", "question": "what city ?",
                                                      "answers": [{"text": city, "answer_start": start}]}]})
    data = {"version": "1.1", "data": [{"title": "separable", "paragraphs": paragraphs}]}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
