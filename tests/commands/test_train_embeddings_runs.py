"""`bertforge train-embeddings` from the command line: runs on scored pairs and triplets, bad input refused.

A topic file of `tests/commands/test_train_embeddings.py` (its module-level fixtures `tiny`, `toy` and `trained`
override `tests/commands/conftest.py`'s `tiny`). Everything runs on a tiny random BERT (2 layers, 32 wide) and data made here."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

import bertforge
from bertforge.cli import main
from tests.embeddings_train.embeddings_train_helpers import (
    A,
    B,
    N,
    PERMUTATION,
    beir_folder,
    TRAIN_TEMPLATES,
    make_model,
    pairs,
    train_on_toy_task,
    write_toy_task,
    write_tsv,
)

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> tuple[Path, Path]:
    return write_toy_task(tmp_path_factory.mktemp("toy"))


@pytest.fixture(scope="module")
def trained(tiny, toy, tmp_path_factory) -> Path:
    """A short run on the toy task through the command line, with most training options set."""
    return train_on_toy_task(tiny, toy, tmp_path_factory.mktemp("runs") / "trained")


# ---------------------------------------------------------------------------------------------------- training


def test_scored_pairs_cosent_and_cosine_with_matryoshka_and_caching(tiny, tmp_path, capsys):
    rng = random.Random(1)
    rows = [(f"{A[i]} is here", f"the {B[PERMUTATION[i] if k else rng.randrange(N)]} now", rng.choice([4, 5]) if k else rng.choice([0, 1]))
            for i in range(N) for k in (0, 1)]
    train = write_tsv(tmp_path / "sts.tsv", rows, "sentence1\tsentence2\tscore")
    dev = write_tsv(tmp_path / "sts_dev.tsv", rows[::3])
    out = tmp_path / "sts_out"
    for loss in ("cosent", "cosine"):
        rc = main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--dev", str(dev), "--out", str(out),
                   "--loss", loss, "--score-max", "5", "--matryoshka-dims", "32,16", "--mini-batch-size", "12",
                   "--scale", "10", "--batch-size", "16", "--epochs", "2", "--lr", "1e-3", "--no-progress",
                   "--overwrite"])
        assert rc == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["shape"] == "scored" and summary["loss"] == loss and summary["main_metric"] == "spearman"
        assert set(summary["best"]["metrics"]) == {"spearman", "pearson"}


def test_triplets_symmetric_cls_unnormalized_round_trip(tiny, tmp_path):
    rows = [(a, p, n) for (a, p), (_, n) in zip(pairs(TRAIN_TEMPLATES)[:32], pairs(TRAIN_TEMPLATES)[32:64])]
    train = tmp_path / "triplets.jsonl"
    train.write_text("".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n" for a, p, n in rows))
    out = tmp_path / "cls_out"
    assert main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(out), "--symmetric",
                 "--pooling", "cls", "--no-normalize", "--batch-size", "8", "--no-progress"]) == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["shape"] == "triplets" and summary["before"] is None and summary["best"] is None
    assert summary["train_steps"] == 4
    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((out / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling"] and not (out / "2_Normalize").exists()
    texts = ["the a1 is here", "b3 there", "see"]
    reference = st.SentenceTransformer(str(out), device="cpu").encode(texts)
    ours = bertforge.pipeline("embed", model=out)(texts)
    assert np.abs(reference - ours).max() <= 1e-5
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0)


def test_out_is_not_replaced_without_overwrite(trained, tiny, toy, capsys):
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--out", str(trained), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--overwrite" in err and len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------------- bad input

BAD_FILES = [
    ("one.tsv", "only one column\nanother\n", "need at least two texts"),
    ("ragged.tsv", "a\tb\nc\td\ne\n", "ragged.tsv:3: 1 field"),
    ("empty_text.tsv", "anchor\tpositive\nx\ty\n \tz\n", "empty_text.tsv:3: anchor is empty"),
    ("bad_score.tsv", "sentence1\tsentence2\tscore\nx\ty\t0.5\nx\ty\thigh\n", "bad_score.tsv:3: the score 'high' is not a number"),
    ("four_scored.tsv", "a\tb\tc\td\tscore\nx\ty\tz\tw\t1\n", "a scored file holds two texts and a score, or three"),
    ("keys.jsonl", '{"anchor": "x", "positive": "y"}\n{"anchor": "x", "pos": "y"}\n', "keys.jsonl:2: keys"),
    ("not_text.jsonl", '{"anchor": "x", "positive": 3}\n', "not_text.jsonl:1: positive is not a text"),
    ("broken.jsonl", '{"anchor": "x", "positive": "y"}\n{"anchor": \n', "broken.jsonl:2"),
    ("blank.tsv", "\n\n", "the file is empty"),
]


@pytest.mark.parametrize("name, content, message", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_files_are_refused_naming_the_line(tiny, tmp_path, capsys, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(tmp_path / name), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--loss", "mnrl"], "--loss mnrl needs pairs or triplets; this file holds scored"),
    (["--symmetric"], "--symmetric applies to --loss mnrl, not cosent"),
    (["--matryoshka-dims", "64,32"], "--matryoshka-dims 64 is larger than the embedding (32)"),
    (["--matryoshka-dims", "32,x"], "--matryoshka-dims must be integers"),
    (["--max-length", "999"], "--max-length 999 exceeds the longest sequence the model takes (64"),
    (["--mini-batch-size", "0"], "mini_batch_size must be an integer >= 1"),
])
def test_bad_settings_are_refused(tiny, tmp_path, capsys, args, message):
    train = write_tsv(tmp_path / "sts.tsv", [("a", "b", 1), ("c", "d", 0)], "sentence1\tsentence2\tscore")
    rc = main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o"), *args])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err


def test_unknown_precision_is_refused_by_the_parser(tiny, tmp_path, capsys):
    train = write_tsv(tmp_path / "sts.tsv", [("a", "b", 1), ("c", "d", 0)], "sentence1\tsentence2\tscore")
    with pytest.raises(SystemExit) as exit_:
        main(["train-embeddings", "--model", str(tiny), "--train", str(train), "--out", str(tmp_path / "o"),
              "--precision", "fp8"])
    assert exit_.value.code == 2 and "invalid choice: 'fp8'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_beir_folder_as_dev_and_evaluate_agree(tiny, toy, tmp_path, capsys):
    """--dev DIR (a BEIR folder made of the toy dev pairs): NDCG@10 picks the best evaluation, and `bertforge
    evaluate --task retrieval` on the saved model gives eval.json's best numbers."""
    folder = beir_folder(tmp_path / "beir")
    out = tmp_path / "run"
    assert main(["train-embeddings", "--model", str(tiny), "--train", str(toy[0]), "--dev", str(folder), "--out",
                 str(out), "--epochs", "2", "--batch-size", "16", "--lr", "1e-3", "--max-length", "16",
                 "--no-progress"]) == 0
    summary = json.loads((out / "eval.json").read_text())
    assert summary["main_metric"] == "ndcg@10" and "map@100" in summary["best"]["metrics"]
    capsys.readouterr()
    assert main(["evaluate", "--task", "retrieval", "--model", str(out), "--input", str(folder), "--max-length", "16",
                 "--no-progress"]) == 0
    ours = json.loads(capsys.readouterr().out)
    for name, value in summary["best"]["metrics"].items():
        assert abs(ours[name] - value) < 1e-6, name
