"""Tests of `bertforge.evaluation.data`: scored pairs in every format, BEIR folders, reranking rows, and what each
refuses."""

from __future__ import annotations

import json

import pytest

from bertforge import BertforgeError
from bertforge.evaluation.data import read_beir, read_rerank, read_scored_pairs
from tests.evaluation.evaluation_helpers import beir_for_st, write_rerank_rows, write_sts


def test_scored_pairs_with_and_without_a_header_jsonl_and_parquet(tmp_path):
    first, second, scores = write_sts(tmp_path / "h.csv", 6)
    write_sts(tmp_path / "n.csv", 6, header=False)
    rows = [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in zip(first, second, scores)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = [tmp_path / "h.csv", tmp_path / "n.csv", tmp_path / "p.jsonl"]
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "p.parquet")
    files.append(tmp_path / "p.parquet")
    for path in files:
        data = read_scored_pairs(path)
        assert (data.texts, data.scores) == ([first, second], scores), path.name


def test_pairs_without_scores_are_refused(tmp_path):
    (tmp_path / "pairs.csv").write_text("anchor,positive\na cat sat,a cat was sitting\n")
    with pytest.raises(BertforgeError, match="needs scored pairs .* holds pairs"):
        read_scored_pairs(tmp_path / "pairs.csv")


def test_beir_folder(beir, tmp_path):
    data = read_beir(beir)
    queries, corpus, relevant = beir_for_st(beir)
    assert data.corpus_ids == sorted(corpus) and data.corpus == [corpus[c] for c in data.corpus_ids]
    assert "unjudged" not in data.query_ids and len(data.query_ids) == len(relevant)
    assert data.relevant == [relevant[q] for q in data.query_ids]
    assert "missing-doc" in data.relevant[0]  # judged relevant, not in the corpus: counts against recall
    other = tmp_path / "dev.tsv"
    other.write_text("query-id\tcorpus-id\tscore\nq1\td3\t2\n")
    assert read_beir(beir, other).relevant == [{"d3"}]


def test_beir_mistakes(beir, tmp_path):
    with pytest.raises(BertforgeError, match="not a directory"):
        read_beir(beir / "corpus.jsonl")
    with pytest.raises(BertforgeError, match="no such qrels file .*--qrels"):
        read_beir(beir, tmp_path / "none.tsv")
    bad = tmp_path / "bad.tsv"
    bad.write_text("q1 d3 1\n")
    with pytest.raises(BertforgeError, match="bad.tsv:1: expected 3 tab-separated fields"):
        read_beir(beir, bad)
    bad.write_text("q1\td3\thigh\n")
    with pytest.raises(BertforgeError, match="the score 'high' is not a number"):
        read_beir(beir, bad)
    bad.write_text("nobody\td3\t1\n")
    with pytest.raises(BertforgeError, match="no query of queries.jsonl has a relevant document"):
        read_beir(beir, bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BertforgeError, match="corpus.jsonl: no such file"):
        read_beir(empty)


def test_rerank_rows_merge_by_query(tmp_path):
    rows = write_rerank_rows(tmp_path / "rows.jsonl")
    data = read_rerank(tmp_path / "rows.jsonl")
    assert data.queries == [r["query"] for r in rows[:-1]]
    assert data.candidates[0] == rows[0]["positive"] + rows[0]["negative"] + rows[-1]["negative"]
    assert data.relevant[0] == [True] * len(rows[0]["positive"]) + [False] * (len(data.candidates[0]) - len(rows[0]["positive"]))
    (tmp_path / "rows.csv").write_text("query,positive,negative\nwho,him,her\nwho,him,them\n")
    csv_data = read_rerank(tmp_path / "rows.csv")
    assert (csv_data.candidates, csv_data.relevant) == ([["him", "her", "them"]], [[True, False, False]])
    (tmp_path / "none.csv").write_text("query,positive,negative\nwho,,her\n")
    with pytest.raises(BertforgeError, match="has no positive"):
        read_rerank(tmp_path / "none.csv")
    (tmp_path / "nothing.csv").write_text("query,positive,negative\nwho,,\n")
    with pytest.raises(BertforgeError, match="nothing.csv:2: the row has no document"):
        read_rerank(tmp_path / "nothing.csv")
    (tmp_path / "named.csv").write_text("question,good,bad\nwho,him,her\n")  # three columns: by position
    assert read_rerank(tmp_path / "named.csv").candidates == [["him", "her"]]
    mined = [{"anchor": "who", "positive": "him", "negative_1": "her", "negative_2": "them"}]
    assert read_rerank(mined).relevant == [[True, False, False]]
    scored = [{"query": "who", "document": d, "label": v} for d, v in (("her", 0.2), ("him", 0.9))]
    assert (read_rerank(scored).candidates, read_rerank(scored).relevant) == ([["him", "her"]], [[True, False]])
