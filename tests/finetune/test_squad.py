"""Tests of `bertforge.finetune.squad`: SQuAD files read, and their errors naming the file, the line and the question."""

import json

import pytest

from bertforge import BertforgeError
from bertforge.finetune.squad import read_squad

from .conftest import write_squad


def test_squad_reader(tmp_path):
    examples, version_2 = read_squad(write_squad(tmp_path / "s.json"))
    assert version_2 and len(examples) == 12
    first = examples[0]
    assert first.context[first.answers[0][1] :].startswith("paris") and not first.is_impossible
    assert examples[1].is_impossible and examples[1].answers == []
    _, v1 = read_squad(write_squad(tmp_path / "v1.json", version_2=False))
    assert not v1


def test_squad_answer_offset_mismatch_names_line(tmp_path):
    path = write_squad(tmp_path / "s.json")
    data = json.loads(path.read_text())
    data["data"][0]["paragraphs"][1]["qas"][0]["answers"][0]["answer_start"] += 1
    path.write_text(json.dumps(data, indent=1))
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if '"id": "q2"' in text)
    with pytest.raises(BertforgeError, match=rf"s\.json:{line}: question q2: answer 'peter' does not match the context"):
        read_squad(path)


def test_squad_v1_question_without_answer(tmp_path):
    path = tmp_path / "s.json"
    qa = {"id": "a1", "question": "q?", "answers": []}
    path.write_text(json.dumps({"version": "1.1", "data": [{"paragraphs": [{"context": "c", "qas": [qa]}]}]}))
    with pytest.raises(BertforgeError, match=r"s\.json:1: question a1: no answers"):
        read_squad(path)


def flat_rows(path) -> list[dict]:
    """A SQuAD file's questions as flat rows, the `datasets` squad layout."""
    rows = []
    for paragraph in json.loads(path.read_text())["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            rows.append({"id": qa["id"], "title": "tiny", "context": paragraph["context"], "question": qa["question"],
                         "answers": {"text": [a["text"] for a in qa["answers"]],
                                     "answer_start": [a["answer_start"] for a in qa["answers"]]}})
    return rows


def test_flat_rows_in_every_form_read_as_the_squad_file(tmp_path):
    pa = pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    import pyarrow.parquet as pq

    path = write_squad(tmp_path / "s.json")
    expected = read_squad(path)
    rows = flat_rows(path)
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "s.parquet", row_group_size=5)
    for data in (tmp_path / "s.jsonl", str(tmp_path / "s.parquet"), rows, datasets.Dataset.from_list(rows),
                 {k: [r[k] for r in rows] for k in rows[0]}):
        examples, version_2 = read_squad(data)
        assert version_2 and [(e.id, e.question, e.context, e.answers, e.is_impossible) for e in examples] == [
            (e.id, e.question, e.context, e.answers, e.is_impossible) for e in expected[0]]
        assert [e.line for e in examples] == list(range(1, 13))
    as_list = [dict(r, answers=[{"text": t, "answer_start": s} for t, s in zip(r["answers"]["text"],
                                                                            r["answers"]["answer_start"])])
               for r in rows]  # a list of answer objects, as in the nested layout
    assert [e.answers for e in read_squad(as_list)[0]] == [e.answers for e in expected[0]]
    v1 = [r for r in rows if r["answers"]["text"]]
    assert read_squad(v1)[1] is False


def test_a_bad_flat_row_is_named_by_its_number(tmp_path):
    good = {"id": "a", "question": "where ?", "context": "in paris", "answers": {"text": ["paris"], "answer_start": [3]}}
    second = dict(good, id="b")
    for bad, message in [
        (dict(second, answers={"text": ["paris"], "answer_start": [2]}), r":2: question b: answer 'paris' does not match"),
        (dict(second, answers={"text": ["paris"], "answer_start": []}), r":2: question b: 'answers' has 1 texts but 0"),
        (dict(second, answers="paris"), r":2: question b: 'answers' must be \{'text'"),
        ({k: v for k, v in second.items() if k != "answers"}, r":2: question b: no key 'answers'"),
        (good, r":2: question a: the id is used twice"),
        (dict(second, context=" "), r":2: the context is empty"),
    ]:
        with pytest.raises(BertforgeError, match=message):
            read_squad([good, bad])
    unlabelled, version_2 = read_squad([{"question": "where ?", "context": "in paris"}], require_answers=False)
    assert unlabelled[0].id == "1" and unlabelled[0].answers == [] and not version_2


def test_rows_with_other_column_names_read_with_the_column_options(tmp_path):
    """`--text-column` / `--text-pair-column` / `--label-column` name a flat row's question, context and answers
    (as NER rows and classification rows take them); a SQuAD JSON file, with its fixed keys, refuses them."""
    from bertforge.finetune.config import DataOptions
    from bertforge.finetune.tasks import QuestionAnswering

    path = write_squad(tmp_path / "s.json")
    expected = read_squad(path)[0]
    renamed = [{"id": r["id"], "query": r["question"], "passage": r["context"], "spans": r["answers"]}
               for r in flat_rows(path)]
    opts = DataOptions(text_column="query", text_pair_column="passage", label_column="spans")
    examples, version_2 = QuestionAnswering().read(renamed, opts, labelled=True)
    assert version_2 and [(e.id, e.question, e.context, e.answers) for e in examples] == [
        (e.id, e.question, e.context, e.answers) for e in expected]
    with pytest.raises(BertforgeError, match="expected string keys 'question' and 'context' .other names: "
                                             "--text-column QUESTION --text-pair-column CONTEXT"):
        QuestionAnswering().read(renamed, DataOptions(), labelled=True)
    with pytest.raises(BertforgeError, match="no key 'answers' .*another name: --label-column"):
        QuestionAnswering().read(renamed, DataOptions(text_column="query", text_pair_column="passage"), labelled=True)
    with pytest.raises(BertforgeError, match="a SQuAD JSON file has fixed keys"):
        QuestionAnswering().read(path, opts, labelled=True)
