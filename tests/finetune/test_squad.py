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
