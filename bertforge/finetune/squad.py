"""SQuAD data for extractive QA: v1.1 / v2.0 JSON (nested: data → paragraphs → qas), or flat rows, one question
a row, in the `datasets` squad layout — "id", "question", "context" and "answers" = {"text": [...],
"answer_start": [...]} (an empty list: unanswerable, as squad_v2 has it) — from a JSONL, Parquet or Arrow file or
in memory (read as `data.record_source` reads classification rows). For prediction "answers" (and "id") may be
left out. Every problem is a `BertforgeError` naming the file and line (the line of the question's "id"; a row's
number)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from ..data.tables import Record, is_path
from .data import file_path, read_text_file, record_source


@dataclass
class QAExample:
    """One SQuAD question with its context and gold answers ((text, character start) pairs)."""

    id: str
    question: str
    context: str
    answers: list[tuple[str, int]] = field(default_factory=list)
    is_impossible: bool = False
    line: int = 0


def _id_lines(text: str) -> dict[str, int]:
    """The line of each `"id": "..."` in a SQuAD file, to name lines in errors about a question."""
    lines: dict[str, int] = {}
    for match in re.finditer(r'"id"\s*:\s*"((?:[^"\\]|\\.)*)"', text):
        lines.setdefault(json.loads(f'"{match.group(1)}"'), text.count("\n", 0, match.start()) + 1)
    return lines


#: the keys of a flat row: question, context, answers (`datasets`' squad layout; `read_squad`'s `columns`)
SQUAD_COLUMNS = ("question", "context", "answers")


def read_squad(data: Any, require_answers: bool = True,
               columns: tuple[str, str, str] = SQUAD_COLUMNS) -> tuple[list[QAExample], bool]:
    """Read a SQuAD JSON file, or flat rows (a JSONL, Parquet or Arrow file, rows in memory); returns the questions
    and whether it is SQuAD 2.0 (by its "version", or because it has unanswerable questions).

    Every answer must be found in its context at its `answer_start`; an answerable question needs at least one
    answer when `require_answers` is set. `columns`: the keys of a flat row's question, context and answers (a
    SQuAD JSON file has its own, fixed).
    """
    if not (is_path(data) and Path(data).suffix.lower() == ".json"):
        source = record_source(data)
        if source is not None:
            examples = _squad_rows(*source, require_answers, columns)
            return examples, any(e.is_impossible for e in examples)
    path = file_path(data)
    if tuple(columns) != SQUAD_COLUMNS:
        raise BertforgeError(f"{path}: a SQuAD JSON file has fixed keys (question, context, answers); the column "
                             "options (--text-column, --text-pair-column, --label-column) are for flat rows")
    text = read_text_file(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BertforgeError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise BertforgeError(f"{path}:1: not a SQuAD file (expected an object with a 'data' list)")
    lines = _id_lines(text)
    version_2 = str(data.get("version", "")).lstrip("v").startswith("2")
    examples = []
    seen: set[str] = set()
    for article in data["data"]:
        for paragraph in article.get("paragraphs", []) if isinstance(article, dict) else []:
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str) or not context.strip():
                raise BertforgeError(f"{path}: a paragraph of {article.get('title', '?')!r} has no context text")
            for qa in paragraph.get("qas", []):
                examples.append(_squad_question(path, qa, context, lines, version_2, require_answers, seen))
    if not examples:
        raise BertforgeError(f"{path}: no questions")
    return examples, version_2 or any(e.is_impossible for e in examples)


def _squad_question(
    path: Path,
    qa: Any,
    context: str,
    lines: dict[str, int],
    version_2: bool,
    require_answers: bool,
    seen: set[str],
) -> QAExample:
    if not isinstance(qa, dict) or not isinstance(qa.get("id"), str) or not isinstance(qa.get("question"), str):
        raise BertforgeError(f"{path}: a question lacks a string 'id' or 'question' ({str(qa)[:80]})")
    qid = qa["id"]
    where = f"{path}:{lines.get(qid, 0)}: question {qid}"
    if qid in seen:
        raise BertforgeError(f"{where}: the id is used twice")
    seen.add(qid)
    impossible = bool(qa.get("is_impossible", False))
    answers = _checked_answers(where, context, qa.get("answers", []) or [])
    if require_answers and not answers and not impossible:
        hint = "" if version_2 else " (SQuAD 1.1 has no unanswerable questions)"
        raise BertforgeError(f"{where}: no answers and not marked is_impossible{hint}")
    if impossible:
        answers = []
    return QAExample(qid, qa["question"], context, answers, impossible, lines.get(qid, 0))


def _checked_answers(where: str, context: str, given: Any) -> list[tuple[str, int]]:
    """(text, start) of each answer, each found in the context at its start."""
    answers = []
    for answer in given if isinstance(given, list) else [given]:
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
            raise BertforgeError(f"{where}: an answer lacks its 'text'")
        start = answer.get("answer_start")
        if isinstance(start, bool) or not isinstance(start, int):
            raise BertforgeError(f"{where}: answer {answer['text']!r} has no integer 'answer_start'")
        found = context[start : start + len(answer["text"])]
        if start < 0 or found != answer["text"]:
            raise BertforgeError(
                f"{where}: answer {answer['text']!r} does not match the context at answer_start={start} "
                f"(the context there reads {found!r})"
            )
        answers.append((answer["text"], start))
    return answers


def _squad_rows(path: Path, records: list[Record], require_answers: bool,
                columns: tuple[str, str, str] = SQUAD_COLUMNS) -> list[QAExample]:
    """Flat rows, the `datasets` squad layout: "answers" holds parallel "text" and "answer_start" lists (a list
    of {"text", "answer_start"} objects is read too); no answers is an unanswerable question. `columns`: the keys
    of the question, the context and the answers."""
    q_key, c_key, a_key = columns
    examples = []
    seen: set[str] = set()
    for line, record in records:
        if not isinstance(record.get(q_key), str) or not isinstance(record.get(c_key), str):
            raise BertforgeError(f"{path}:{line}: expected string keys {q_key!r} and {c_key!r}"
                                 + ("" if (q_key, c_key) != SQUAD_COLUMNS[:2] else
                                    " (other names: --text-column QUESTION --text-pair-column CONTEXT)"))
        question, context = record[q_key], record[c_key]
        if not context.strip():
            raise BertforgeError(f"{path}:{line}: the context is empty")
        qid = str(record.get("id", line))
        where = f"{path}:{line}: question {qid}"
        if qid in seen:
            raise BertforgeError(f"{where}: the id is used twice")
        seen.add(qid)
        if a_key not in record:
            if require_answers:
                raise BertforgeError(f"{where}: no key {a_key!r} (the layout of `datasets`' squad: "
                                     "{'text': [...], 'answer_start': [...]}; another name: --label-column)")
            examples.append(QAExample(qid, question, context, line=line))
            continue
        answers = _checked_answers(where, context, _answer_objects(where, record[a_key]))
        examples.append(QAExample(qid, question, context, answers, not answers, line))
    return examples


def _answer_objects(where: str, answers: Any) -> list[Any]:
    """{"text": [...], "answer_start": [...]} as a list of {"text", "answer_start"} objects."""
    if isinstance(answers, list):
        return answers
    if not isinstance(answers, dict) or not all(isinstance(answers.get(k), (list, tuple)) for k in ("text", "answer_start")):
        raise BertforgeError(f"{where}: 'answers' must be {{'text': [...], 'answer_start': [...]}}, got {str(answers)[:80]}")
    if len(answers["text"]) != len(answers["answer_start"]):
        raise BertforgeError(f"{where}: 'answers' has {len(answers['text'])} texts but "
                             f"{len(answers['answer_start'])} answer_start values")
    return [{"text": t, "answer_start": s} for t, s in zip(answers["text"], answers["answer_start"])]
