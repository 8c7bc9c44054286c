"""`bertforge.core.io`: an atomic write leaves the old file or the new one, never a part; JSONL objects and text files
are checked; every failure is a `BertforgeError` naming the file."""

from __future__ import annotations

import re

import pytest

from bertforge.core.errors import BertforgeError
from bertforge.core.io import atomic_write, atomic_write_text, binary_reason, check_text, json_object


def test_an_atomic_write_replaces_the_target_or_leaves_it_as_it_was(tmp_path):
    target = tmp_path / "sub" / "notes.txt"
    atomic_write_text(target, "first\n")  # the directory is made
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"

    def full_disk(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")

    with pytest.raises(BertforgeError, match=re.escape(f"cannot write {target}: No space left on device")):
        atomic_write(target, full_disk)
    assert target.read_text() == "second\n"
    assert [p.name for p in target.parent.iterdir()] == ["notes.txt"]  # no temporary file left behind


def test_json_object_names_the_line():
    assert json_object('{"text": "a"}', "f.jsonl:1") == {"text": "a"}
    with pytest.raises(BertforgeError, match="^f.jsonl:2: not valid JSON"):
        json_object("{text", "f.jsonl:2")
    with pytest.raises(BertforgeError, match="^f.jsonl:3: expected a JSON object, got list$"):
        json_object("[1, 2]", "f.jsonl:3")


def test_binary_files_are_told_from_text(tmp_path):
    assert binary_reason("plain text, ünïcödé\ttabs\r\n".encode()) is None
    assert binary_reason(b"text\x00more") == "a NUL byte at offset 4"
    assert "UTF-16" in binary_reason("text".encode("utf-16"))
    assert "control characters" in binary_reason(bytes(range(1, 32)) * 10)
    text, utf16 = tmp_path / "ok.txt", tmp_path / "utf16.txt"
    text.write_text("a line\n", encoding="utf-8")
    utf16.write_text("a line\n", encoding="utf-16")
    check_text(text)
    with pytest.raises(BertforgeError, match=re.escape(f"{utf16}: not a text file: UTF-16")):
        check_text(utf16)
