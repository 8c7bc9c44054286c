"""Tests of `bertforge.embeddings_train.data`: pairs, triplets and scored pairs and triplets read, shapes detected, scores
scaled, prompts resolved by column."""

from __future__ import annotations

import pytest

from bertforge.embeddings_train.data import column_prompts, normalized_scores, read_pairs, with_prompts
from bertforge.core.errors import BertforgeError
from tests.embeddings_train.embeddings_train_helpers import write_tsv


def test_shapes_are_detected(tmp_path):
    header_pairs = read_pairs(write_tsv(tmp_path / "p.tsv", [("q one", "d one"), ("q two", "d two")], "query\tpassage"))
    assert header_pairs.shape == "pairs" and header_pairs.texts == [["q one", "q two"], ["d one", "d two"]]
    plain_pairs = read_pairs(write_tsv(tmp_path / "p2.tsv", [("hello", "world"), ("a", "b")]))
    assert plain_pairs.shape == "pairs" and plain_pairs.texts[0] == ["hello", "a"]  # no header: every row is data
    (tmp_path / "s.csv").write_text("a b,c d,3.5\ne,f,0\n")
    scored = read_pairs(tmp_path / "s.csv")  # no header: the last column is a number on every row
    assert scored.shape == "scored" and scored.scores == [3.5, 0.0]
    (tmp_path / "t.csv").write_text('anchor,positive,negative_1,negative_2\n"a, quoted",b,c,d\n')
    triplets = read_pairs(tmp_path / "t.csv")
    assert triplets.shape == "triplets" and triplets.texts == [["a, quoted"], ["b"], ["c"], ["d"]]
    (tmp_path / "s.jsonl").write_text('{"sentence1": "x", "sentence2": "y", "label": 0.5}\n\n{"sentence1": "z", "sentence2": "w", "label": 1}\n')
    jsonl = read_pairs(tmp_path / "s.jsonl")
    assert jsonl.shape == "scored" and jsonl.scores == [0.5, 1.0] and jsonl.lines == [1, 3]


def test_score_scale(tmp_path):
    def scores(values, score_max=None):
        data = read_pairs(write_tsv(tmp_path / "s.tsv", [(f"a{i}", "b", v) for i, v in enumerate(values)], "a\tb\tscore"))
        return normalized_scores(data, score_max)

    assert scores([0.0, 0.5, 1.0]) == [0.0, 0.5, 1.0]
    assert scores([-1.0, 0.25]) == [-1.0, 0.25]
    assert scores([0.0, 2.5, 5.0]) == [0.0, 0.5, 1.0]  # STS: divided by 5
    assert scores([0, 50, 100], score_max=100) == [0.0, 0.5, 1.0]
    with pytest.raises(BertforgeError, match="--score-max"):
        scores([0, 7])
    with pytest.raises(BertforgeError, match="beyond --score-max 4"):
        scores([0, 5], score_max=4)


def test_parquet_arrow_and_rows_in_memory_read_as_jsonl(tmp_path):
    import json

    pa = pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    for rows in ([{"anchor": f"q {i}", "positive": f"p {i}", "negative": f"n {i}"} for i in range(5)],
                 [{"sentence1": f"a {i}", "sentence2": f"b {i}", "score": i / 5} for i in range(5)]):
        jsonl = tmp_path / "d.jsonl"
        jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        expected = read_pairs(jsonl)
        table = pa.Table.from_pylist(rows)
        pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
        feather.write_feather(table, tmp_path / "d.feather")
        columns = {k: [r[k] for r in rows] for k in rows[0]}
        for data in (tmp_path / "d.parquet", tmp_path / "d.feather", rows, columns, datasets.Dataset.from_list(rows)):
            got = read_pairs(data)
            assert (got.shape, got.texts, got.scores, got.lines) == (expected.shape, expected.texts, expected.scores,
                                                                      expected.lines), data
    with pytest.raises(BertforgeError, match=r"<in-memory: 2 rows, sha256 [0-9a-f]+>:2: positive is empty"):
        read_pairs([{"anchor": "a", "positive": "b"}, {"anchor": "c", "positive": " "}])


def test_scored_triplets_and_column_names(tmp_path):
    """Three texts and a score: a teacher's margins (kept as they are); the text columns' names kept."""
    rows = [("q one", "p one", "n one", 7.5), ("q two", "p two", "n two", -1.25)]
    data = read_pairs(write_tsv(tmp_path / "m.tsv", rows, "query\tpositive\tnegative\tscore"))
    assert data.shape == "scored-triplets" and data.scores == [7.5, -1.25]
    assert data.names == ["query", "positive", "negative"] and data.texts[2] == ["n one", "n two"]
    headerless = read_pairs(write_tsv(tmp_path / "h.tsv", rows))  # the last column a number on every row
    assert headerless.shape == "scored-triplets" and headerless.names == ["text0", "text1", "text2"]


def test_prompts_go_to_the_columns_they_name_else_by_role(tmp_path):
    data = read_pairs(write_tsv(tmp_path / "t.tsv", [("a", "b", "c")], "anchor\tpositive\tnegative"))
    assert column_prompts(data, {}) == ["", "", ""]
    assert column_prompts(data, {"query": "q: ", "document": "d: "}) == ["q: ", "d: ", "d: "]  # the roles
    assert column_prompts(data, {"query": "q: ", "negative": "n: ", "document": "d: "}) == ["q: ", "d: ", "n: "]
    assert with_prompts(data, ["q: ", "", "n: "]).texts == [["q: a"], ["b"], ["n: c"]]
    with pytest.raises(BertforgeError, match="--prompts 'passage' names no column of .*t.tsv \\(its columns are "
                                             "anchor, positive, negative\\)"):
        column_prompts(data, {"passage": "p: "})
    assert column_prompts(data, {"passage": "p: "}, strict=False) == ["", "", ""]
    plain = read_pairs(write_tsv(tmp_path / "p.tsv", [("hello there", "world here")]))
    with pytest.raises(BertforgeError, match="it has no column names"):
        column_prompts(plain, {"anchor": "p: "})
