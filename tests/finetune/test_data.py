"""File readers and their errors: each names the file, the line and the problem."""

import pytest

from bertforge import BertforgeError
from bertforge.finetune.data import read_classification, read_conll

from .conftest import write_conll


def test_tsv_with_header(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text('sentence\tlabel\nit \'s "quoted" , ok\t1\n\nfine\t0\n', encoding="utf-8")
    examples = read_classification(path)
    assert [(e.text, e.label, e.line) for e in examples] == [('it \'s "quoted" , ok', "1", 2), ("fine", "0", 4)]


def test_csv_pairs_and_quotes(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text('premise,hypothesis,gold\n"a, b",c,yes\nd,"e\nf",no\n', encoding="utf-8")
    examples = read_classification(path, "premise", "hypothesis", "gold")
    assert [(e.text, e.text_pair, e.label) for e in examples] == [("a, b", "c", "yes"), ("d", "e\nf", "no")]
    assert examples[1].line == 4  # the record ends on line 4


def test_jsonl_and_header_less_tsv(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"text": "x", "label": 1}\n{"text": "y", "label": "pos"}\n', encoding="utf-8")
    assert [e.label for e in read_classification(jsonl)] == [1, "pos"]
    cola = tmp_path / "in_domain_train.tsv"  # CoLA: source, label, original label, sentence
    cola.write_text("gj04\t1\t\tOur friends won't buy this.\ngj04\t0\t*\tThey drank the pub.\n", encoding="utf-8")
    examples = read_classification(cola, text_column="3", label_column="1", no_header=True)
    assert [(e.text, e.label, e.line) for e in examples] == [("Our friends won't buy this.", "1", 1),
                                                           ("They drank the pub.", "0", 2)]


@pytest.mark.parametrize(
    "name, content, kwargs, message",
    [
        ("d.tsv", "sentence\tlbl\nx\t1\n", {}, r"d\.tsv:1: no column 'label' in the header \(columns: sentence, lbl\)"),
        ("d.tsv", "", {}, r"d\.tsv: the file is empty"),
        ("d.tsv", "sentence\tlabel\n", {}, r"d\.tsv: no examples"),
        ("d.tsv", "sentence\tlabel\nx\t1\ny\n", {}, r"d\.tsv:3: 1 field, but the header has 2"),
        ("d.tsv", "sentence\tlabel\nx\t\n", {}, r"d\.tsv:2: the label is empty"),
        ("d.jsonl", '{"text": "x", "label": 1}\n{"text": "y"}\n', {}, r"d\.jsonl:2: no key 'label'"),
        ("d.jsonl", '{"text": "x", "label": 1}\n{oops\n', {}, r"d\.jsonl:2: not valid JSON"),
        ("d.tsv", "a\tb\n", {"no_header": True, "text_column": "sentence"}, r"must be a column index"),
    ],
)
def test_classification_errors(tmp_path, name, content, kwargs, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertforgeError, match=message):
        read_classification(path, **kwargs)


def test_conll_reader(tmp_path):
    sentences = read_conll(write_conll(tmp_path / "ner.txt", copies=1))
    assert len(sentences) == 4
    assert sentences[0].words == ["john", "lives", "in", "amsterdam", "."]
    assert sentences[0].tags == ["B-PER", "O", "O", "B-LOC", "O"]
    assert sentences[0].line == 3 and sentences[1].line == 9  # after -DOCSTART- and a blank line


@pytest.mark.parametrize(
    "content, message",
    [
        ("a NN O\nb NN O\nc O\n", r"ner\.txt:3: 2 column\(s\), expected 3"),
        ("\n\n-DOCSTART- -X- O\n\n", r"ner\.txt: no sentences"),
        ("", r"ner\.txt: the file is empty"),
        ("word\nother\n", r"ner\.txt:1: one column only"),
    ],
)
def test_conll_errors(tmp_path, content, message):
    path = tmp_path / "ner.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(BertforgeError, match=message):
        read_conll(path)


# ---------------------------------------------------------------------------------------------------- other formats

FORMAT_ROWS = [{"sentence1": f"first text {i}", "sentence2": f"second {i}", "label": ["neg", "pos"][i % 2]}
               for i in range(7)]


def _write_formats(root, rows):
    """The same rows as JSONL, CSV, TSV, Parquet, Feather and an Arrow stream."""
    import csv
    import json

    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    paths = {k: root / f"d.{k}" for k in ("jsonl", "csv", "tsv", "parquet", "feather")}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    for kind, delimiter in (("csv", ","), ("tsv", "\t")):
        with open(paths[kind], "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]), delimiter=delimiter)
            writer.writeheader()
            writer.writerows([{k: "|".join(v) if isinstance(v, list) else v for k, v in r.items()} for r in rows])
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=3)
    feather.write_feather(pa.Table.from_pylist(rows), paths["feather"])
    paths["arrows"] = root / "d.arrows"  # the stream format, by its registered extension (was read as CSV text)
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(paths["arrows"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return paths


def _as_tuples(examples):
    return [(e.text, e.text_pair, e.label) for e in examples]


def test_every_format_and_rows_in_memory_read_as_jsonl(tmp_path):
    paths = _write_formats(tmp_path, FORMAT_ROWS)
    expected = read_classification(paths["jsonl"])
    assert [e.line for e in expected] == list(range(1, 8))
    for kind in ("csv", "tsv", "parquet", "feather", "arrows"):
        assert _as_tuples(read_classification(paths[kind])) == _as_tuples(expected), kind
    for kind in ("parquet", "feather", "arrows"):  # rows numbered from 1, as a JSONL file's lines
        assert read_classification(paths[kind]) == expected
    datasets = pytest.importorskip("datasets")
    columns = {k: [r[k] for r in FORMAT_ROWS] for k in FORMAT_ROWS[0]}
    for rows in (FORMAT_ROWS, columns, datasets.Dataset.from_list(FORMAT_ROWS)):
        assert read_classification(rows) == expected
    unlabelled = [{"text": r["sentence1"]} for r in FORMAT_ROWS]
    assert [e.label for e in read_classification(unlabelled, require_labels=False)] == [None] * 7


def test_multi_label_rows_are_lists_or_split_on_the_separator(tmp_path):
    rows = [{"text": f"text {i}", "label": [["sports"], ["sports", "politics"], []][i % 3]} for i in range(6)]
    paths = _write_formats(tmp_path, rows)
    expected = read_classification(paths["jsonl"])
    assert [e.label for e in expected] == [r["label"] for r in rows]
    for kind in ("parquet", "feather"):  # a list column
        assert read_classification(paths[kind]) == expected
    for kind in ("csv", "tsv"):  # "sports|politics", "" for no label
        assert _as_tuples(read_classification(paths[kind], label_separator="|")) == _as_tuples(expected)
        # issue 46: without the separator it was "the label is empty" alone; now the separator to pass is named
        with pytest.raises(BertforgeError, match=r"the label is empty; other labels hold several joined by '\|' "
                                                 r"\(such as 'sports\|politics'\): a multi-label file\? Pass "
                                                 r"--label-separator '\|'"):
            read_classification(paths[kind])
    assert read_classification(rows) == expected
    with pytest.raises(BertforgeError, match=r":2: each label in a list must be a non-empty string or a number"):
        read_classification([{"text": "a", "label": ["x"]}, {"text": "b", "label": ["x", None]}])


def test_the_conll_file_reader_refuses_rows_in_memory():  # the NER task reads rows through `tagged.read_tagged`
    with pytest.raises(BertforgeError, match="not a CoNLL or SQuAD JSON file; this reader reads a file: pass its path"):
        read_conll([{"tokens": ["a"], "tags": ["O"]}])
