"""SQuAD files for extractive QA: v1.1 / v2.0 JSON, or, for prediction, JSONL objects with "question" and
"context" (and an optional "id"). Every problem is a `BertforgeError` naming the file and line (the line of the
question's "id")."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import BertforgeError
from .data import file_format, file_path, jsonl_objects, read_text_file


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


def read_squad(path: str | Path, require_answers: bool = True) -> tuple[list[QAExample], bool]:
    """Read a SQuAD JSON file; returns the questions and whether it is SQuAD 2.0 (by its "version", or because
    it has unanswerable questions).

    Every answer must be found in its context at its `answer_start`; an answerable question needs at least one
    answer when `require_answers` is set. Prediction input may also be JSONL with "question" and "context"
    (and an optional "id").
    """
    path = file_path(path)
    text = read_text_file(path)
    if file_format(path) == "jsonl" and path.suffix.lower() != ".json":
        return _read_qa_jsonl(path, text), False
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BertforgeError(f"{path}:{err.lineno}: invalid JSON ({err.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise BertforgeError(f"{path}:1: not a SQuAD file (expected an object with a 'data' list)")
    lines = _id_lines(text)
    version_2 = str(data.get("version", "")).lstrip("v").startswith("2")
    examples: list[QAExample] = []
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
    answers = []
    for answer in qa.get("answers", []) or []:
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
    if require_answers and not answers and not impossible:
        hint = "" if version_2 else " (SQuAD 1.1 has no unanswerable questions)"
        raise BertforgeError(f"{where}: no answers and not marked is_impossible{hint}")
    if impossible:
        answers = []
    return QAExample(qid, qa["question"], context, answers, impossible, lines.get(qid, 0))


def _read_qa_jsonl(path: Path, text: str) -> list[QAExample]:
    examples = []
    for line, record in jsonl_objects(path, text):
        if not isinstance(record.get("question"), str) or not isinstance(record.get("context"), str):
            raise BertforgeError(f"{path}:{line}: expected string keys 'question' and 'context'")
        if not record["context"].strip():
            raise BertforgeError(f"{path}:{line}: the context is empty")
        examples.append(QAExample(str(record.get("id", line)), record["question"], record["context"], line=line))
    return examples
