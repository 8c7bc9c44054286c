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
