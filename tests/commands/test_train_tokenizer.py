"""`bertforge train-tokenizer` (`bertforge.commands.train_tokenizer`): its options shape the vocabulary it trains."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bertforge.cli import main
from bertforge.tokenizer import Tokenizer
from tests.helpers import make_corpus

from .cmd_helpers import WORDS, sentences


def train_tokenizer(tmp_path: Path, corpus: Path, *argv: str) -> list[str]:
    out = tmp_path / f"tok{len(list(tmp_path.iterdir()))}"
    assert main(["train-tokenizer", "--corpus", str(corpus), "--out", str(out), *argv]) == 0
    tok = Tokenizer.from_pretrained(out)
    return tok.convert_ids_to_tokens(list(range(tok.vocab_size)))


def test_train_tokenizer_vocab_size_cased_and_text_field(tmp_path, capsys):
    rng = random.Random(3)
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(
        json.dumps({"text": " ".join(sentences(rng, ["Submarine", "harbour"], 3)),
                    "body": " ".join(sentences(rng, ["Lighthouse", "castle"], 3))}) + "\n" for _ in range(30)))
    words = make_corpus(tmp_path / "words.txt", words=WORDS)
    for size in (80, 110):
        assert len(train_tokenizer(tmp_path, words, "--vocab-size", str(size))) == size
    lowered = train_tokenizer(tmp_path, corpus, "--vocab-size", "200")
    assert "submarine" in lowered and "Submarine" not in lowered and "lighthouse" not in lowered
    cased = train_tokenizer(tmp_path, corpus, "--vocab-size", "200", "--cased")
    assert "Submarine" in cased and "submarine" not in cased
    body = train_tokenizer(tmp_path, corpus, "--vocab-size", "200", "--text-column", "body")
    assert "lighthouse" in body and "submarine" not in body


def test_train_tokenizer_sample_mb_and_min_frequency(tmp_path, capsys):
    rng = random.Random(4)
    corpus = tmp_path / "corpus.txt"
    # "quixotic" three times near the start; later, 60 kB without it
    lines = sentences(rng, ["castle", "forest"], 20) + ["a quixotic plan", "quixotic", "so quixotic"]
    corpus.write_text("\n".join(lines + sentences(rng, ["submarine", "harbour"], 3000)) + "\n")
    assert "quixotic" in train_tokenizer(tmp_path, corpus, "--vocab-size", "200", "--min-frequency", "2")
    assert "quixotic" not in train_tokenizer(tmp_path, corpus, "--vocab-size", "200", "--min-frequency", "4")
    sampled = train_tokenizer(tmp_path, corpus, "--vocab-size", "200", "--sample-mb", "0.001")
    assert "castle" in sampled and "submarine" not in sampled
    assert "submarine" in train_tokenizer(tmp_path, corpus, "--vocab-size", "200")
