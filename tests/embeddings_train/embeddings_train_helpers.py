"""Helpers of the sentence-embedding training tests: a toy retrieval task and a tiny random BERT (2 layers, 32 wide).

The task: anchors a0..a15, each paired with one of b0..b15 by a fixed random permutation, in sentence templates."""

from __future__ import annotations

import json

import random
from pathlib import Path

import torch

from bertforge import BertForMaskedLM, BertModel
from tests.helpers import SPECIALS, tiny_config, write_uncased_tokenizer

N = 16  # anchors a0..a15, each paired with one of b0..b15 (a fixed random permutation): learnable, no shared token
A = [f"a{i}" for i in range(N)]
B = [f"b{i}" for i in range(N)]
FILLERS = "the is here there now see some one with and".split()
VOCAB = SPECIALS + A + B + FILLERS
PERMUTATION = random.Random(0).sample(range(N), N)
TRAIN_TEMPLATES = [("the {} is here", "{} there"), ("{} now", "see {}"), ("some {}", "one {} with"), ("{} and the", "{} is")]
DEV_TEMPLATES = [("the {} now", "see {} here")]  # the same pairs in words never seen together in training


def pairs(templates: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(ta.format(A[i]), tb.format(B[PERMUTATION[i]])) for ta, tb in templates for i in range(N)]


def write_tsv(path: Path, rows: list[tuple], header: str | None = None) -> Path:
    lines = ([header] if header else []) + ["\t".join(str(c) for c in row) for row in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_model(directory: Path, **config) -> Path:
    write_uncased_tokenizer(directory, VOCAB)
    torch.manual_seed(0)
    BertModel(tiny_config(vocab_size=len(VOCAB), **config)).save_pretrained(directory)
    return directory


def make_mlm_model(directory: Path, **config) -> Path:
    """The tiny random BERT with its MLM head (what SPLADE training starts from)."""
    write_uncased_tokenizer(directory, VOCAB)
    torch.manual_seed(0)
    BertForMaskedLM(tiny_config(vocab_size=len(VOCAB), **config)).save_pretrained(directory)
    return directory


def write_toy_task(root: Path) -> tuple[Path, Path]:
    """The toy task's train pairs (with a header) and dev pairs, as TSV files in `root`."""
    return (write_tsv(root / "train.tsv", pairs(TRAIN_TEMPLATES), "anchor\tpositive"),
            write_tsv(root / "dev.tsv", pairs(DEV_TEMPLATES)))


def train_on_toy_task(model: Path, toy: tuple[Path, Path], out: Path) -> Path:
    """A short `bertforge train-embeddings` run of `model` on the toy task into `out`, with most options set."""
    from bertforge.cli import main

    rc = main(["train-embeddings", "--model", str(model), "--train", str(toy[0]), "--dev", str(toy[1]), "--out", str(out),
               "--epochs", "6", "--batch-size", "16", "--lr", "1e-3", "--warmup-ratio", "0.1", "--weight-decay", "0.01",
               "--seed", "1", "--log-every", "2", "--eval-every", "8", "--early-stop-patience", "20", "--eval-batch-size", "8",
               "--max-length", "16", "--pooling", "mean", "--max-skipped-steps", "3", "--device", "cpu",
               "--no-progress"])
    assert rc == 0
    return out


def beir_folder(folder: Path) -> Path:
    """The toy dev pairs as a BEIR folder (queries q_i, documents d_i, q_i relevant to d_i)."""
    (folder / "qrels").mkdir(parents=True)
    dev = pairs(DEV_TEMPLATES)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": b}) + "\n"
                                                 for i, (_, b) in enumerate(dev)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": a}) + "\n"
                                                  for i, (a, _) in enumerate(dev)))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n"
                                                                                          for i in range(len(dev))))
    return folder
