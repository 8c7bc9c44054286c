"""`bertforge.finetune.tagged`: NER rows of words and tags (JSONL, Parquet, Arrow, in memory) give the examples and
the encoded features a CoNLL file of the same sentences gives; tag ids are named by ClassLabel names or the model's
id2label; problems name the row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.finetune.config import DataOptions
from bertforge.finetune.data import read_conll
from bertforge.finetune.tagged import read_tagged
from bertforge.finetune.tasks import TokenClassification, _split_words
from bertforge.model.config import BertConfig
from bertforge.tokenizer import Tokenizer

from .conftest import NER_SENTENCES, write_conll

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
import pyarrow.feather as feather  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

NAMES = ["O", "B-PER", "B-LOC", "B-ORG", "I-ORG"]  # ids of the tags, as a ClassLabel would number them


def ner_rows(copies: int = 3, ids: bool = False) -> list[dict]:
    """NER_SENTENCES in the `datasets` conll2003 layout, with conll2003's -DOCSTART- row first."""
    rows = [{"tokens": ["-DOCSTART-"], "ner_tags": [0] if ids else ["O"]}]
    for _ in range(copies):
        rows += [{"tokens": [w for w, _ in s], "ner_tags": [NAMES.index(t) if ids else t for _, t in s]}
                 for s in NER_SENTENCES]
    return rows


def write_rows(root: Path, rows: list[dict]) -> dict[str, Path]:
    paths = {"jsonl": root / "ner.jsonl", "parquet": root / "ner.parquet", "feather": root / "ner.feather"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    pq.write_table(pa.Table.from_pylist(rows), paths["parquet"], row_group_size=4)
    feather.write_feather(pa.Table.from_pylist(rows), paths["feather"], chunksize=5)
    return paths


def class_label_dataset(rows: list[dict]):
    features = datasets.Features({"tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=NAMES))})
    return datasets.Dataset.from_list(rows, features=features)


def encoded(tiny_model: Path, data, labelled: bool = True, **options):
    task, opts = TokenClassification(), DataOptions(max_length=16, **options)
    examples, _ = task.read(data, opts, labelled)
    config = BertConfig.from_pretrained(tiny_model, **task.label_overrides(examples, Path("x")))
    return [(s.words, s.tags) for s in examples], task.encode(Tokenizer.from_pretrained(tiny_model), examples, opts,
                                                              config, Path("x"), labelled).features


def test_every_form_of_rows_gives_the_examples_and_features_of_the_conll_file(tiny_model, tmp_path):
    expected = encoded(tiny_model, write_conll(tmp_path / "ner.txt"))
    assert len(expected[0]) == 12 and expected[1][0]["labels"]
    rows = ner_rows()
    forms = {**write_rows(tmp_path, rows), "list of dicts": rows,
             "dict of lists": {k: [r[k] for r in rows] for k in rows[0]},
             "dataset": datasets.Dataset.from_list(rows),
             "dataset of ClassLabel ids": class_label_dataset(ner_rows(ids=True))}
    ids_parquet = tmp_path / "ids.parquet"
    class_label_dataset(ner_rows(ids=True)).to_parquet(str(ids_parquet))  # keeps the names in its metadata
    forms["parquet of ClassLabel ids"] = ids_parquet
    for form, data in forms.items():
        assert encoded(tiny_model, data) == expected, form


def test_columns_are_named_by_the_classification_options(tiny_model, tmp_path):
    expected = encoded(tiny_model, write_conll(tmp_path / "ner.txt"))
    rows = [{"words": r["tokens"], "labels": r["ner_tags"], "other": 1} for r in ner_rows()]
    assert encoded(tiny_model, rows, text_column="words", label_column="labels") == expected
    plain = [{"words": r["tokens"], "tags": r["ner_tags"]} for r in ner_rows()]  # "words" and "tags" are found
    assert encoded(tiny_model, plain) == expected
    with pytest.raises(BertforgeError, match=r"<in-memory: 13 rows, sha256 \w+>:2: no key 'labels' \(the tags"):
        read_tagged(plain, label_column="labels")
    with pytest.raises(BertforgeError, match=r":1: no key 'tokens' \(the words; name it with --text-column\)"):
        read_tagged([{"text": "john lives here", "ner_tags": ["B-PER", "O", "O"]}])


def test_integer_tags_without_names_take_the_model_id2label(tiny_model, tmp_path):
    ids = [{k: v for k, v in r.items()} for r in ner_rows(ids=True)]
    with pytest.raises(BertforgeError, match="the tags are integer ids without their names"):
        encoded(tiny_model, ids)
    task, opts = TokenClassification(), DataOptions(max_length=16)
    examples, _ = task.read(ids, opts, True)
    config = BertConfig.from_pretrained(tiny_model, id2label=dict(enumerate(NAMES)))
    by_ids = task.encode(Tokenizer.from_pretrained(tiny_model), examples, opts, config, Path("x"), True)
    assert [s.tags for s in by_ids.examples] == [s.tags for s in read_conll(write_conll(tmp_path / "n.txt"))]
    small = BertConfig.from_pretrained(tiny_model, id2label={0: "O", 1: "B-PER"})
    examples, _ = task.read(ids, opts, True)
    with pytest.raises(BertforgeError, match=r"x:2, word 4: tag id 2 is not in the model's id2label \(2 labels\)"):
        task.encode(Tokenizer.from_pretrained(tiny_model), examples, opts, small, Path("x"), True)


def test_a_bad_row_is_named_by_its_number():
    good = {"tokens": ["john", "lives"], "ner_tags": ["B-PER", "O"]}
    for bad, message in [
        ({"tokens": ["john"], "ner_tags": ["B-PER", "O"]}, r":2: 2 tags for 1 words"),
        ({"tokens": ["john", "x"], "ner_tags": ["B-PER", None]}, r":2: tag None \(word 2\) is neither a tag"),
        ({"tokens": [], "ner_tags": []}, r":2: not a non-empty list of non-empty strings at key 'tokens'"),
        ({"tokens": ["john", "x"], "ner_tags": ["B-PER", "PERSON"]}, r":2, word 2: tag 'PERSON' is not an IOB"),
    ]:
        with pytest.raises(BertforgeError, match=message):
            read_tagged([good, bad])


def test_unlabelled_rows_give_words_or_a_text_split_into_words(tiny_model, tmp_path):
    rows = [{"tokens": ["john", "lives"]}, {"text": "mary works."}]
    split = TokenClassification().read(rows, DataOptions(), labelled=False)[0]
    assert [s.words for s in split] == [["john", "lives"], ["mary", "works", "."]]
    assert split[1].char_spans == [(0, 4), (5, 10), (10, 11)] and split[1].text == "mary works."
    with pytest.raises(BertforgeError, match=r":1: no key 'ner_tags'"):
        read_tagged(rows)
    named = read_tagged([{"sentence": "mary works."}], "sentence", require_labels=False, split_words=_split_words)
    assert named[0].words == split[1].words and named[0].char_spans == split[1].char_spans
