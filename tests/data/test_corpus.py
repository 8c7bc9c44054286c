"""Tests of `bertforge.data.corpus`: documents read from text, gzip and JSON-lines files, sharded and resumed."""

import gzip
import json

import pytest
from tests.data.data_helpers import tagged_docs, write_gz, write_jsonl, write_txt

from bertforge.data import DEFAULT_CORPUS, CorpusReader, iter_documents, list_corpus_files
from bertforge.core.errors import BertforgeError


def read_all(paths, **kw):
    return [doc.sentences for doc in CorpusReader(paths, cycle=False, **kw)]


def test_text_documents_split_on_blank_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes(b"\xef\xbb\xbfone\r\n  two  \n\n\n \t \nthree\n\nfour\nfive")
    assert read_all(path) == [["one", "two"], ["three"], ["four", "five"]]


def test_gz_and_jsonl_formats(tmp_path):
    docs = tagged_docs(5, seed=3)
    assert read_all(write_gz(tmp_path / "c.txt.gz", docs)) == docs
    assert read_all(write_jsonl(tmp_path / "c.jsonl", docs)) == docs
    body = write_jsonl(tmp_path / "body.jsonl", docs, field="body")
    assert read_all(body, text_column="body") == docs
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as fh:
        fh.write((tmp_path / "c.jsonl").read_text())
    assert read_all(tmp_path / "c.jsonl.gz") == docs


def test_jsonl_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{not json}\n')
    with pytest.raises(BertforgeError, match=r"bad\.jsonl:2: not valid JSON"):
        read_all(bad)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"body": "x"}\n')
    with pytest.raises(BertforgeError, match=r"nofield\.jsonl:1: no text field 'text' \(fields: body\)"):
        read_all(nofield)


def test_directories_recursive_sorted(tmp_path):
    write_txt(tmp_path / "b" / "z.txt", [["b-z"]])
    write_txt(tmp_path / "b" / "a.txt", [["b-a"]])
    write_gz(tmp_path / "a" / "deep" / "x.gz", [["a-deep-x"]])
    write_jsonl(tmp_path / "a" / "y.jsonl", [["a-y"]])
    (tmp_path / "a" / "notes.md").write_text("ignored")
    write_txt(tmp_path / ".hidden" / "h.txt", [["hidden"]])
    names = [p.relative_to(tmp_path).as_posix() for p in list_corpus_files(tmp_path)]
    assert names == ["a/deep/x.gz", "a/y.jsonl", "b/a.txt", "b/z.txt"]
    assert list(iter_documents(tmp_path)) == ["a-deep-x", "a-y", "b-a", "b-z"]
    assert list(iter_documents([tmp_path / "b"], as_documents=True)) == [["b-a"], ["b-z"]]


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("caf\u00e9 ok\n\nna\u00efve\n".encode("latin-1") + b"\xff\xfe end\n")
    reader = CorpusReader(path, cycle=False)
    docs = [d.sentences for d in reader]
    assert docs == [["caf\ufffd ok"], ["na\ufffdve", "\ufffd\ufffd end"]]
    assert reader.bytes_replaced == 4


def test_missing_and_empty_corpus(tmp_path):
    with pytest.raises(BertforgeError, match="does not exist"):
        CorpusReader(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_text("\n\n   \n")
    with pytest.raises(BertforgeError, match="has no text"):
        list(iter_documents(tmp_path / "empty.txt"))
    (tmp_path / "d").mkdir()
    with pytest.raises(BertforgeError, match="no .txt, .gz or .jsonl files"):
        CorpusReader(tmp_path / "d")
    with pytest.raises(BertforgeError, match="has no text"):
        CorpusReader(tmp_path / "empty.txt").next_document()


@pytest.mark.parametrize("shard_by", ["document", "file"])
def test_sharding_is_disjoint_and_complete(tmp_path, shard_by):
    docs = tagged_docs(23, seed=4)
    for i in range(4):
        write_txt(tmp_path / f"part{i}.txt", docs[i::4])
    everything = sorted(map(tuple, read_all(tmp_path)))
    shards = [read_all(tmp_path, rank=r, world_size=3, shard_by=shard_by) for r in range(3)]
    seen = [tuple(d) for shard in shards for d in shard]
    assert all(shards)
    assert len(seen) == len(set(seen)) == len(everything)
    assert sorted(seen) == everything
    with pytest.raises(BertforgeError, match="at least one file per rank"):
        CorpusReader(tmp_path, rank=0, world_size=5, shard_by="file")


@pytest.mark.parametrize("fmt", ["txt", "gz", "jsonl"])
def test_reader_resumes_from_its_position(tmp_path, fmt):
    docs = tagged_docs(30, seed=5)
    writer = {"txt": write_txt, "gz": write_gz, "jsonl": write_jsonl}[fmt]
    writer(tmp_path / "one" / f"a.{fmt}", docs[:17])
    writer(tmp_path / "one" / f"b.{fmt}", docs[17:])
    reader = CorpusReader(tmp_path / "one", rank=1, world_size=2)
    for _ in range(11):  # into the second file and the second epoch
        reader.next_document()
    state = json.loads(json.dumps(reader.state_dict()))
    expected = [(d.sentences, d.index, d.epoch) for d in (reader.next_document() for _ in range(25))]
    again = CorpusReader(tmp_path / "one", rank=1, world_size=2)
    again.load_state_dict(state)
    assert [(d.sentences, d.index, d.epoch) for d in (again.next_document() for _ in range(25))] == expected
    assert reader.docs_per_epoch == 15


def test_default_corpus_is_bundled():
    docs = list(iter_documents(DEFAULT_CORPUS, as_documents=True))
    assert len(docs) >= 20
    text = " ".join(s for d in docs for s in d)
    assert 300_000 < len(text) < 2_000_000
    assert "Gutenberg" not in text and "\ufffd" not in text
