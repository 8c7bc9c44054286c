"""The reliability page's table (docs/reliability.md, once README's "Reliability" section) names, for each figure,
the test that produces it: every named test must exist (the file is there and defines the function at module
level), so renaming or deleting a test behind a figure fails here; a figure for `-m slow` must name at least one
test marked slow; and every row must name a test."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reliability.md"
NODE_ID = re.compile(r"`([^`\s]+\.py)::([A-Za-z_][A-Za-z0-9_]*)(\[[^`]*\])?`")


def split_row(line: str) -> list[str]:
    """Cells of a Markdown table row (no cell of this table holds a `|`)."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def reliability_rows(text: str) -> tuple[list[str], list[dict[str, str]]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len(lines) >= 3, "no table in docs/reliability.md"
    header = split_row(lines[0])
    assert set(split_row(lines[1])) <= {"---", ":---", "---:", ":---:"}, lines[1]
    rows = [dict(zip(header, split_row(line), strict=True)) for line in lines[2:]]
    return header, rows


@cache
def module_tests(path: Path) -> dict[str, bool]:
    """Module-level test functions of a file: name -> marked slow (by a decorator)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found[node.name] = any(ast.unparse(d).endswith("mark.slow") for d in node.decorator_list)
    return found


def named_tests(cell: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in NODE_ID.finditer(cell)]


def check_rows(rows: list[dict[str, str]]) -> list[str]:
    problems = []
    for row in rows:
        what, tests = row["check"], named_tests(row["test"])
        if not tests:
            problems.append(f"{what!r}: names no test (`tests/....py::test_name`)")
            continue
        slow = []
        for file, name in tests:
            path = ROOT / file
            if not path.is_file():
                problems.append(f"{what!r}: {file} does not exist")
            elif name not in module_tests(path):
                problems.append(f"{what!r}: {file} defines no test function {name}")
            else:
                slow.append(module_tests(path)[name])
        if "-m slow" in row["check"] + row["result"] and len(slow) == len(tests) and not any(slow):
            problems.append(f"{what!r}: a `-m slow` figure, but none of its tests is marked slow")
    return problems


def test_every_reliability_figure_names_an_existing_test():
    header, rows = reliability_rows(PAGE.read_text(encoding="utf-8"))
    assert header == ["check", "result", "test"], header
    assert len(rows) >= 8, f"only {len(rows)} rows: was the table cut?"
    problems = check_rows(rows)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cell, problem", [
    ("", "names no test"),
    ("`tests/reliability/no_such_file.py::test_x`", "does not exist"),
    ("`tests/reliability/test_rel_crash.py::test_no_such_test`", "defines no test function"),
    ("`tests/reliability/test_rel_crash.py::test_sigkill_and_resume_fast`", "none of its tests is marked slow"),
])
def test_the_check_itself_catches_a_bad_row(cell, problem):
    """The checker is not vacuous: a row naming nothing, a missing file, a missing function, or only fast tests
    behind a `-m slow` figure is reported."""
    row = {"check": "x", "result": "3 / 3; `-m slow`: 50 / 50", "test": cell}
    problems = check_rows([row])
    assert len(problems) == 1 and problem in problems[0], problems
    fine = {"check": "x", "result": "3 / 3", "test": "`tests/reliability/test_rel_crash.py::test_sigkill_and_resume_fast`"}
    assert check_rows([fine]) == []
